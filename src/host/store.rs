//! [`SharedStore`] over Envoy's shared-data hostcalls: host `Status` values
//! become [`StoreError`]s here, at the adapter boundary.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

use crate::store::{SharedStore, StoreError, Versioned};

/// The VM's shared data (one map per `vm_id`, shared by every worker).
pub struct HostStore;

impl SharedStore for HostStore {
    fn get(&self, key: &str) -> Result<Versioned, StoreError> {
        hostcalls::get_shared_data(key).map_err(|s| host_error(key, s))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(s) => Err(host_error(key, s)),
        }
    }
}

fn host_error(key: &str, status: Status) -> StoreError {
    StoreError::Host {
        key: key.to_string(),
        status: format!("{status:?}"),
    }
}
