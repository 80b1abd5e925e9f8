//! Triton's system shared-memory extension: a client on the same host registers a POSIX
//! shared-memory object (`shm_open`'s key, a file under `/dev/shm`) as a named region, then
//! names a region, an offset and a size in place of an input's data, or as where an output's
//! data goes. No tensor bytes cross the socket.
//!
//! Regions are read and written with positioned file I/O (`pread`/`pwrite` on the tmpfs file):
//! one copy between the region and the tensor, and no unsafe memory mapping of memory another
//! process may change at any time.
//!
//! CUDA shared memory (device memory named by a CUDA IPC handle) is not taken: its routes and
//! RPCs answer with [`no_cuda_region`] and [`NO_CUDA`], so that a client sees why.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use sheaf_core::{ErrorKind, InferError};

/// Where POSIX shared-memory objects live on Linux.
const SHM_DIR: &str = "/dev/shm";

/// Why a CUDA shared-memory region cannot be registered, and what to use instead.
pub const NO_CUDA: &str = "CUDA shared memory is not supported by this server: register a \
system shared-memory region (POST /v2/systemsharedmemory/region/NAME/register, or \
SystemSharedMemoryRegister over gRPC), or send the tensor in the request";

/// A status request for the CUDA shared-memory region `name`: none is ever registered.
pub fn no_cuda_region(name: &str) -> InferError {
    InferError::new(
        ErrorKind::ModelNotFound,
        format!(
            "no CUDA shared-memory region '{}' is registered: {NO_CUDA}",
            sheaf_core::clip(name)
        ),
    )
}

/// One registered region, as the status calls report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

struct Region {
    status: RegionStatus,
    file: Arc<File>,
}

/// The registered regions of one server.
#[derive(Default)]
pub struct SharedMemory {
    regions: RwLock<BTreeMap<String, Region>>,
}

/// Where a tensor's data is in a region: `byte_size` bytes at `offset` within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub region: String,
    pub offset: u64,
    pub byte_size: u64,
}

impl SharedMemory {
    /// Registers `key`'s bytes `offset..offset + byte_size` as region `name`.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), InferError> {
        if name.is_empty() {
            return Err(InferError::invalid("a shared-memory region needs a name"));
        }
        let path = shm_path(key)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                InferError::invalid(format!(
                    "shared-memory key '{}' cannot be opened: {e}",
                    sheaf_core::clip(key)
                ))
            })?;
        let size = file
            .metadata()
            .map_err(|e| InferError::internal(format!("shared memory '{key}': {e}")))?
            .len();
        let end = offset.checked_add(byte_size);
        if end.is_none_or(|end| end > size) {
            return Err(InferError::invalid(format!(
                "shared-memory key '{}' holds {size} bytes; offset {offset} and byte_size \
                 {byte_size} reach past it",
                sheaf_core::clip(key)
            )));
        }
        let mut regions = self.write();
        if regions.contains_key(name) {
            return Err(InferError::invalid(format!(
                "shared-memory region '{}' is already registered; unregister it first",
                sheaf_core::clip(name)
            )));
        }
        regions.insert(
            name.to_string(),
            Region {
                status: RegionStatus {
                    name: name.to_string(),
                    key: key.to_string(),
                    offset,
                    byte_size,
                },
                file: Arc::new(file),
            },
        );
        tracing::info!(
            region = name,
            key,
            offset,
            byte_size,
            "shared-memory region registered"
        );
        Ok(())
    }

    /// Unregisters region `name`, or every region when `name` is empty. An unknown name is not
    /// an error (as Triton answers).
    pub fn unregister(&self, name: &str) {
        let mut regions = self.write();
        if name.is_empty() {
            regions.clear();
        } else {
            regions.remove(name);
        }
    }

    /// Region `name`, or every region when `name` is empty; an unknown name is an error.
    pub fn status(&self, name: &str) -> Result<Vec<RegionStatus>, InferError> {
        let regions = self.read_lock();
        if name.is_empty() {
            return Ok(regions.values().map(|r| r.status.clone()).collect());
        }
        regions
            .get(name)
            .map(|r| vec![r.status.clone()])
            .ok_or_else(|| InferError::new(ErrorKind::ModelNotFound, unknown(name).message))
    }

    /// The bytes a tensor's placement names.
    pub fn read(&self, at: &Placement) -> Result<Bytes, InferError> {
        let (file, start) = self.locate(at, at.byte_size)?;
        let len = usize::try_from(at.byte_size)
            .map_err(|_| InferError::invalid("shared_memory_byte_size is too large"))?;
        let mut data = vec![0u8; len];
        file.read_exact_at(&mut data, start).map_err(|e| {
            InferError::internal(format!("shared-memory region '{}': {e}", at.region))
        })?;
        Ok(Bytes::from(data))
    }

    /// Writes `data` where an output's placement names; it must fit.
    pub fn write_at(&self, at: &Placement, output: &str, data: &[u8]) -> Result<(), InferError> {
        if data.len() as u64 > at.byte_size {
            return Err(InferError::invalid(format!(
                "output '{output}' is {} bytes, more than the {} bytes of shared memory given for it",
                data.len(),
                at.byte_size
            )));
        }
        let (file, start) = self.locate(at, data.len() as u64)?;
        file.write_all_at(data, start)
            .map_err(|e| InferError::internal(format!("shared-memory region '{}': {e}", at.region)))
    }

    /// The region's file and the absolute offset of `len` bytes at the placement, checked
    /// against the region's bounds.
    fn locate(&self, at: &Placement, len: u64) -> Result<(Arc<File>, u64), InferError> {
        let regions = self.read_lock();
        let region = regions.get(&at.region).ok_or_else(|| unknown(&at.region))?;
        let s = &region.status;
        if at
            .offset
            .checked_add(len)
            .is_none_or(|end| end > s.byte_size)
        {
            return Err(InferError::invalid(format!(
                "shared-memory region '{}' holds {} bytes; offset {} and byte size {len} reach \
                 past it",
                at.region, s.byte_size, at.offset
            )));
        }
        Ok((region.file.clone(), s.offset + at.offset))
    }

    fn read_lock(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Region>> {
        self.regions.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Region>> {
        self.regions.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A request that names a region nobody registered: the client's mistake (400), as Triton
/// answers it. (Asking for the status of such a region is a 404.)
fn unknown(name: &str) -> InferError {
    InferError::invalid(format!(
        "no shared-memory region '{}' is registered",
        sheaf_core::clip(name)
    ))
}

/// The file of a POSIX shared-memory key (`/name` or `name`): one name, no folders.
fn shm_path(key: &str) -> Result<PathBuf, InferError> {
    let name = key.strip_prefix('/').unwrap_or(key);
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(InferError::invalid(format!(
            "shared-memory key '{}' is not a POSIX shared-memory name (letters, digits, '_', \
             '-' and '.', after an optional '/')",
            sheaf_core::clip(key)
        )));
    }
    Ok(PathBuf::from(SHM_DIR).join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_registered_read_written_and_bounded() {
        let key = format!("sheaf-test-{}", std::process::id());
        let path = PathBuf::from(SHM_DIR).join(&key);
        std::fs::write(&path, [0u8; 64]).unwrap();
        let shm = SharedMemory::default();
        shm.register("r", &format!("/{key}"), 16, 32).unwrap();
        assert!(
            shm.register("r", &key, 0, 8).is_err(),
            "a name is registered once"
        );
        let at = |offset, byte_size| Placement {
            region: "r".into(),
            offset,
            byte_size,
        };
        shm.write_at(&at(4, 8), "y", b"abcdefgh").unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[20..28], b"abcdefgh");
        assert_eq!(&shm.read(&at(4, 8)).unwrap()[..], b"abcdefgh");
        // Past the region, past the file, or into another folder: refused.
        assert!(shm.read(&at(30, 8)).is_err());
        assert!(shm.write_at(&at(0, 2), "y", b"abc").is_err());
        assert!(shm.register("s", &key, 60, 8).is_err());
        for bad in ["../etc/passwd", "/a/b", "", ".."] {
            let e = shm.register("s", bad, 0, 1).unwrap_err();
            assert!(e.message.contains("not a POSIX"), "{bad}: {e}");
        }
        assert_eq!(shm.status("").unwrap().len(), 1);
        assert_eq!(
            shm.status("nope").unwrap_err().kind,
            ErrorKind::ModelNotFound
        );
        shm.unregister("");
        assert!(shm.status("").unwrap().is_empty());
        std::fs::remove_file(path).unwrap();
    }
}
