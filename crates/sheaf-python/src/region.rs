//! Shared memory between the server and one model process: a file in `/dev/shm` (or the
//! temporary folder where there is none) that both map.
//!
//! The server writes a batch's inputs into the input region and reads the outputs out of the
//! output region, which the process grows when an answer does not fit. A third region carries
//! the requests the model sends to other models, and their answers, each way in turn. A fourth,
//! the control region, is a fixed size of counters and flags (`worker::open::Control`). The
//! file's name is removed once the process has opened it (or when the region drops, if it
//! never did).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{MmapMut, MmapRaw};
use sheaf_backend::BackendError;

/// A new name in `/dev/shm` (or the temporary folder where there is none), ending in `tag`.
pub(crate) fn shared_path(tag: &str) -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    base.join(format!("sheaf-{}-{n}-{tag}", std::process::id()))
}

/// One mapped file.
pub(crate) struct Region {
    path: PathBuf,
    file: File,
    map: Option<MmapMut>,
    /// Whether dropping the region removes its file's name (the region that made it does).
    owns_name: bool,
}

impl Region {
    /// Creates an empty region file named after `tag`.
    pub(crate) fn create(tag: &str) -> Result<Region, BackendError> {
        let path = shared_path(tag);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| {
                BackendError::Load(format!(
                    "cannot create shared memory {}: {e}",
                    path.display()
                ))
            })?;
        Ok(Region {
            path,
            file,
            map: None,
            owns_name: true,
        })
    }

    /// The same file, mapped apart: for another thread that reads what the process writes.
    pub(crate) fn share(&self) -> Result<Region, BackendError> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| BackendError::Load(format!("cannot share shared memory: {e}")))?;
        Ok(Region {
            path: self.path.clone(),
            file,
            map: None,
            owns_name: false,
        })
    }

    /// Sizes the file to `size` bytes and maps it for any thread to read and write bytes of
    /// it at once (the control region's counter and flags, through atomics).
    pub(crate) fn map_raw(&self, size: usize) -> Result<MmapRaw, BackendError> {
        self.file
            .set_len(size as u64)
            .map_err(|e| BackendError::Load(format!("cannot size shared memory: {e}")))?;
        MmapRaw::map_raw(&self.file)
            .map_err(|e| BackendError::Load(format!("cannot map shared memory: {e}")))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the file's name once both sides have it open: the memory lives on while they
    /// hold it, and nothing is left in `/dev/shm` whatever way the processes end.
    pub(crate) fn unlink(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Bytes mapped now.
    pub(crate) fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// Maps at least `size` bytes, growing the file (by doubling, to 1 MiB at least) when it is
    /// smaller.
    pub(crate) fn reserve(&mut self, size: usize) -> Result<(), BackendError> {
        if size <= self.len() && self.map.is_some() {
            return Ok(());
        }
        let grown = size.max(2 * self.len()).max(1 << 20);
        self.file
            .set_len(grown as u64)
            .map_err(|e| BackendError::Runtime(format!("cannot grow shared memory: {e}")))?;
        self.remap(grown)
    }

    /// Maps the file as the other side left it (it may have grown it).
    pub(crate) fn follow(&mut self) -> Result<(), BackendError> {
        let len = self
            .file
            .metadata()
            .map_err(|e| BackendError::Runtime(format!("shared memory: {e}")))?
            .len() as usize;
        if len != self.len() || self.map.is_none() {
            self.remap(len)?;
        }
        Ok(())
    }

    fn remap(&mut self, len: usize) -> Result<(), BackendError> {
        self.map = None;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the file is this region's own (created above, removed on drop); the only
        // other writer is the model process, which writes the output region while the server
        // waits for its answer and reads the input region the server wrote before asking; a
        // streaming model's responses go into the output region only where the server has read
        // what was there (the control region counts what it has read); in the calls region
        // the process writes a request and waits while the server reads it and writes the
        // answer; so no byte is written on one side while the other reads it.
        let map = unsafe { MmapMut::map_mut(&self.file) }
            .map_err(|e| BackendError::Runtime(format!("cannot map shared memory: {e}")))?;
        self.map = Some(map);
        Ok(())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.map = None;
        if self.owns_name {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
