//! One memory arena per device, shared by every session on it.
//!
//! Left alone, each ONNX Runtime session owns an arena of its own, and an arena keeps what it
//! once held. A model with a session per batch size then holds the sum of its buckets' peaks,
//! and a device holds the sum over its models: on an H100, 1.6-3.0 GB a model whose file is
//! 18-24 MB. Batches of one instance run one after another, so one arena that every session of
//! the device draws from holds about the largest bucket's peak instead.
//!
//! [`register`] creates that arena in the process's ONNX Runtime environment the first time a
//! session on the device is made (CPU: ONNX Runtime's CPU arena; `cuda:N`: the CUDA provider's
//! arena on device N, bounded by the model's `gpu_mem_limit`, the first one given), and sessions
//! opt in with `session.use_env_allocators`.

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::sync::Mutex;

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::AsPointer;
use sheaf_backend::{ArenaExtendStrategy, BackendError, CudaOptions, Device};

/// The devices whose arena is registered.
static REGISTERED: Mutex<Option<HashSet<Device>>> = Mutex::new(None);

/// Registers `device`'s shared arena unless it already is; `cuda` sets a CUDA arena's limit and
/// growth. Returns whether this call registered it.
pub(crate) fn register(device: Device, cuda: &CudaOptions) -> Result<bool, BackendError> {
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    let set = registered.get_or_insert_with(HashSet::new);
    if set.contains(&device) {
        return Ok(false);
    }
    let env = crate::runtime::environment()?;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        BackendError::Load(format!(
            "cannot make the shared memory arena of {device:?}: {what}: {e}"
        ))
    };
    let (memory, limit, extend) = match device {
        Device::Cuda(id) => (
            MemoryInfo::new(
                AllocationDevice::CUDA,
                id,
                AllocatorType::Arena,
                MemoryType::Default,
            ),
            cuda.memory_limit_bytes,
            cuda.arena_extend_strategy,
        ),
        Device::Cpu | Device::Sim => (
            MemoryInfo::new(
                AllocationDevice::CPU,
                0,
                AllocatorType::Arena,
                MemoryType::Default,
            ),
            None,
            ArenaExtendStrategy::SameAsRequested,
        ),
    };
    let memory = memory.map_err(|e| fail("memory info", &e))?;
    let config = ArenaConfig::new(limit, extend).map_err(|e| fail("arena config", &e))?;
    let api = ort::api();
    let status = match device {
        Device::Cuda(id) => {
            const PROVIDER: &CStr = c"CUDAExecutionProvider";
            let key: &CStr = c"device_id";
            let value =
                std::ffi::CString::new(id.to_string()).map_err(|e| fail("device id", &e))?;
            let keys: [*const c_char; 1] = [key.as_ptr()];
            let values: [*const c_char; 1] = [value.as_ptr()];
            // SAFETY: the environment, memory info and arena config are live for the call, and
            // the key and value arrays hold one valid C string each, as `num_keys` says.
            unsafe {
                (api.CreateAndRegisterAllocatorV2)(
                    env.ptr().cast_mut(),
                    PROVIDER.as_ptr(),
                    memory.ptr(),
                    config.0,
                    keys.as_ptr(),
                    values.as_ptr(),
                    1,
                )
            }
        }
        // SAFETY: as above; the CPU arena takes no provider options.
        _ => unsafe {
            (api.CreateAndRegisterAllocator)(env.ptr().cast_mut(), memory.ptr(), config.0)
        },
    };
    // SAFETY: `status` was returned by an ONNX Runtime API call just now.
    unsafe { ort::Error::result_from_status(status) }.map_err(|e| fail("registration", &e))?;
    tracing::info!(?device, limit_bytes = ?limit, "shared memory arena registered for the device's sessions");
    set.insert(device);
    Ok(true)
}

/// An `OrtArenaCfg`, released when dropped (registration copies what it needs).
struct ArenaConfig(*const ort::sys::OrtArenaCfg);

impl ArenaConfig {
    fn new(limit: Option<u64>, extend: ArenaExtendStrategy) -> Result<ArenaConfig, ort::Error> {
        let strategy = match extend {
            ArenaExtendStrategy::NextPowerOfTwo => 0,
            ArenaExtendStrategy::SameAsRequested => 1,
        };
        let mut keys: Vec<*const c_char> = vec![c"arena_extend_strategy".as_ptr()];
        let mut values: Vec<usize> = vec![strategy];
        if let Some(limit) = limit {
            keys.push(c"max_mem".as_ptr());
            values.push(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        let mut out: *mut ort::sys::OrtArenaCfg = std::ptr::null_mut();
        // SAFETY: `keys` and `values` have the same length, passed as `num_keys`, and each key
        // is a static C string.
        let status = unsafe {
            (ort::api().CreateArenaCfgV2)(keys.as_ptr(), values.as_ptr(), keys.len(), &mut out)
        };
        // SAFETY: `status` was returned by the call above.
        unsafe { ort::Error::result_from_status(status) }?;
        Ok(ArenaConfig(out))
    }
}

impl Drop for ArenaConfig {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: made by CreateArenaCfgV2 and released once, here.
            unsafe { (ort::api().ReleaseArenaCfg)(self.0.cast_mut()) }
        }
    }
}
