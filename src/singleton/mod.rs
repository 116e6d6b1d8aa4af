//! The sync singleton's services besides sync itself (that is
//! [`crate::sync::supervisor`]): the [`membership`] refresher and the pod
//! [`signals`] collector. Each runs over the host traits; the host's
//! singleton root context forwards its ticks and their calls' replies here.
//! They sit above `fleet`, `signals`, `sync` and `config`, and nothing but
//! the host imports them.

pub(crate) mod membership;
pub(crate) mod signals;
