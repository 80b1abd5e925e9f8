//! One memory arena per device, shared by every session on it.
//!
//! Left alone, each ONNX Runtime session owns an arena of its own, and an arena keeps what it
//! once held. A model with a session per batch size then holds the sum of its buckets' peaks,
//! and a device holds the sum over its models: on an H100, 1.6-3.0 GB a model whose file is
//! 18-24 MB. Batches of one instance run one after another, so one arena that every session of
//! the device draws from holds about the largest bucket's peak instead.
//!
//! [`register`] creates that arena in the process's ONNX Runtime environment when the first
//! model on the device makes its first session (CPU: ONNX Runtime's CPU arena; `cuda:N`: the
//! CUDA provider's arena on device N, bounded by the `gpu_mem_limit` of the model that made
//! it), and sessions opt in with `session.use_env_allocators`; each model holds it ([`hold`],
//! taken before its first session). An arena keeps the
//! regions it grew for the next model on its device; when the last hold is dropped (the last
//! model on the device unloaded), it is unregistered, its memory goes back to the device, and
//! the next model to load makes a new one.
//!
//! What a model takes of the arena is counted by the arena ([`Footprint`]): on a shared arena,
//! the device's growth while a model loads depends on what the models before it kept.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::Session;
use ort::AsPointer;
use sheaf_backend::{ArenaExtendStrategy, BackendError, CudaOptions, Device};

/// Each device with models on it: how many hold its arena, and whether it is registered.
static DEVICES: Mutex<Option<HashMap<Device, Held>>> = Mutex::new(None);

/// ONNX Runtime reads the environment's list of allocators, unlocked, while it makes a session
/// that uses them, and registering or unregistering one changes that list: sessions are made
/// under the read side ([`making_sessions`]), and the list changes under the write side.
static ALLOCATORS: RwLock<()> = RwLock::new(());

#[derive(Debug, Default)]
struct Held {
    holders: usize,
    registered: bool,
}

/// Held while a session that uses the environment's allocators is made.
pub(crate) fn making_sessions() -> RwLockReadGuard<'static, ()> {
    ALLOCATORS.read().unwrap_or_else(|e| e.into_inner())
}

/// A model's hold on its device's shared arena: the arena stays registered while any is held.
#[derive(Debug)]
pub(crate) struct ArenaHold {
    device: Device,
}

/// A hold on `device`'s arena, taken before the model makes its first session (so that no
/// other model's unload releases the arena while it does).
pub(crate) fn hold(device: Device) -> ArenaHold {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    devices
        .get_or_insert_with(HashMap::new)
        .entry(device)
        .or_default()
        .holders += 1;
    ArenaHold { device }
}

impl Drop for ArenaHold {
    /// The last hold on a device unregisters its arena: ONNX Runtime frees it once no session
    /// uses it (the model's sessions are dropped before its hold).
    fn drop(&mut self) {
        let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(map) = devices.as_mut() else {
            return;
        };
        let Some(held) = map.get_mut(&self.device) else {
            return;
        };
        held.holders = held.holders.saturating_sub(1);
        if held.holders > 0 {
            return;
        }
        let registered = held.registered;
        map.remove(&self.device);
        if registered {
            unregister(self.device);
        }
    }
}

/// Unregisters `device`'s arena from the environment.
fn unregister(device: Device) {
    let _changing = ALLOCATORS.write().unwrap_or_else(|e| e.into_inner());
    let released = memory_info(device).and_then(|memory| {
        let env = crate::runtime::environment().map_err(|e| ort::Error::new(e.to_string()))?;
        // SAFETY: the environment and the memory info are live for the call.
        let status =
            unsafe { (ort::api().UnregisterAllocator)(env.ptr().cast_mut(), memory.ptr()) };
        // SAFETY: `status` was returned by an ONNX Runtime API call just now.
        unsafe { ort::Error::result_from_status(status) }
    });
    match released {
        Ok(()) => tracing::info!(?device, "shared memory arena released"),
        Err(e) => {
            tracing::warn!(?device, error = %e, "the shared memory arena could not be released")
        }
    }
}

/// What the shared arena of `device` is registered as.
fn memory_info(device: Device) -> Result<MemoryInfo<'static>, ort::Error> {
    match device {
        Device::Cuda(id) => MemoryInfo::new(
            AllocationDevice::CUDA,
            id,
            AllocatorType::Arena,
            MemoryType::Default,
        ),
        Device::Cpu | Device::Sim => MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Arena,
            MemoryType::Default,
        ),
    }
}

/// Registers `device`'s shared arena unless it already is (a session that uses it is about to
/// be made); `cuda` sets a new CUDA arena's limit and growth.
pub(crate) fn register(device: Device, cuda: &CudaOptions) -> Result<(), BackendError> {
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let held = devices
        .get_or_insert_with(HashMap::new)
        .entry(device)
        .or_default();
    if !held.registered {
        let _changing = ALLOCATORS.write().unwrap_or_else(|e| e.into_inner());
        make(device, cuda)?;
        held.registered = true;
    }
    Ok(())
}

/// Creates and registers `device`'s arena in the environment.
fn make(device: Device, cuda: &CudaOptions) -> Result<(), BackendError> {
    let env = crate::runtime::environment()?;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        BackendError::Load(format!(
            "cannot make the shared memory arena of {device:?}: {what}: {e}"
        ))
    };
    let (limit, extend) = match device {
        Device::Cuda(_) => (cuda.memory_limit_bytes, cuda.arena_extend_strategy),
        Device::Cpu | Device::Sim => (None, ArenaExtendStrategy::SameAsRequested),
    };
    let memory = memory_info(device).map_err(|e| fail("memory info", &e))?;
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
    Ok(())
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

/// What a device's shared arena holds, by ONNX Runtime's own count: bytes in live
/// allocations, and bytes the arena has taken from the device (its regions).
#[derive(Debug, Clone, Copy)]
struct Usage {
    in_use: u64,
    reserved: u64,
}

impl Usage {
    /// Bytes the arena holds that no allocation uses: room for the next runs.
    fn free(self) -> u64 {
        self.reserved.saturating_sub(self.in_use)
    }
}

/// `device`'s arena's [`Usage`] now, read through `session`, one of its sessions (the
/// environment's own handle on the arena reports no figures); `None` when ONNX Runtime gives
/// none.
fn usage(session: &Session, device: Device) -> Option<Usage> {
    let memory = memory_info(device).ok()?;
    let allocator = ort::memory::Allocator::new(session, memory).ok()?;
    let api = ort::api();
    let mut stats: *mut ort::sys::OrtKeyValuePairs = std::ptr::null_mut();
    // SAFETY: the allocator is live for the call, and `stats` receives a new set of pairs.
    let status = unsafe { (api.AllocatorGetStats)(allocator.ptr(), &mut stats) };
    // SAFETY: `status` was returned by the call above.
    unsafe { ort::Error::result_from_status(status) }.ok()?;
    if stats.is_null() {
        return None;
    }
    let read = |key: &CStr| -> Option<u64> {
        // SAFETY: `stats` is live until it is released below; a value is a C string it owns.
        let value = unsafe { (api.GetKeyValue)(stats, key.as_ptr()) };
        if value.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, owned by `stats`.
        unsafe { CStr::from_ptr(value) }.to_str().ok()?.parse().ok()
    };
    let usage = read(c"InUse")
        .zip(read(c"TotalAllocated"))
        .map(|(in_use, reserved)| Usage { in_use, reserved });
    // SAFETY: made by AllocatorGetStats and released once, here.
    unsafe { (api.ReleaseKeyValuePairs)(stats) };
    usage
}

/// What one instance of a model takes of its device's shared arena, by the arena's count
/// rather than the device's. The device's growth while a model loads is not the model's own
/// when the arena is shared: the warm-up's release gives back every region that holds
/// nothing, the room models loaded before kept for their runs included, so the demo MLP
/// measured 288 MiB loaded first on a 2-core CPU and 81 MiB after EfficientNet-Lite0, and
/// EfficientNet-Lite0 -496 MiB after nsfw on an H200. Counted here: the weights of the
/// model's first session (the file's size: they are in the arena before it can be read),
/// what its allocations have held since (the other sessions' weights, planned buffers),
/// and the room its runs need, which is what the arena grew by, free, in the warm-up's pass
/// after the release. Other models' loads and runs on the device at the same moments move
/// the figure; room their regions already had free is not counted again.
#[derive(Debug)]
pub(crate) struct Footprint {
    device: Device,
    weights: u64,
    start: Option<Usage>,
    released: Option<Usage>,
    bytes: OnceCell<Option<u64>>,
}

impl Footprint {
    /// Counting from the model's first session, just made; `weights`: the model file's bytes.
    pub(crate) fn start(session: &Session, device: Device, weights: u64) -> Footprint {
        Footprint {
            device,
            weights,
            start: usage(session, device),
            released: None,
            bytes: OnceCell::new(),
        }
    }

    /// The warm-up's release has just run on `session`.
    pub(crate) fn released(&mut self, session: &Session) {
        self.released = usage(session, self.device);
    }

    /// The instance's bytes, read through `session` the first time it is asked (after the
    /// warm-up) and the same after; `None` without a release to count the runs' room from,
    /// or without the arena's figures.
    pub(crate) fn bytes(&self, session: &Session) -> Option<u64> {
        *self.bytes.get_or_init(|| {
            let (start, released) = (self.start?, self.released?);
            let now = usage(session, self.device)?;
            let held = now.in_use.saturating_sub(start.in_use);
            let room = now.free().saturating_sub(released.free());
            Some(self.weights + held + room)
        })
    }
}
