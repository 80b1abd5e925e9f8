//! Files written whole and for good: the server's own records on disk (the Files and Batch
//! APIs' descriptions and batch objects in `--files-dir`) and `sheaf run`'s progress file.

use std::path::Path;

/// Writes `data` to `path` whole or not at all, and for good: to a file beside it first, on
/// the disk before it is renamed over `path`, and the rename on the disk too. After a crash or
/// a power cut the file holds the old bytes or the new ones, never an empty or a torn file (a
/// rename can reach the disk before the data it names). The disk's waits block the thread, so
/// on the server's runtime they are taken off its async workers.
pub fn write_whole(path: &Path, data: &[u8]) -> std::io::Result<()> {
    off_the_workers(|| {
        let partial = path.with_extension("partial");
        let mut file = std::fs::File::create(&partial)?;
        std::io::Write::write_all(&mut file, data)?;
        file.sync_data()?;
        std::fs::rename(&partial, path)?;
        sync_folder(path)
    })
}

/// Puts on the disk the names in `path`'s folder: a file made, renamed or removed there.
fn sync_folder(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => std::fs::File::open(folder)?.sync_all(),
        _ => std::fs::File::open(".")?.sync_all(),
    }
}

/// Runs `f`, which blocks on the disk: on a multi-threaded tokio runtime as a blocking section
/// (the worker's other tasks move to another worker meanwhile), elsewhere as it is.
fn off_the_workers<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the server's runtime the write runs as a blocking section; in a single-threaded one
    /// (where that is not allowed) and outside any, as it is. Each way the file is replaced
    /// whole and nothing is left beside it.
    #[test]
    fn a_whole_write_replaces_the_file_on_any_thread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("batch_1.json");
        write_whole(&path, b"{\"a\":1}").unwrap();
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        multi
            .block_on(async { write_whole(&path, b"{\"a\":2}") })
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":2}");
        let single = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        single
            .block_on(async { write_whole(&path, b"{\"a\":3}") })
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":3}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["batch_1.json"]);
        let missing = dir.path().join("gone").join("batch_2.json");
        assert!(write_whole(&missing, b"{}").is_err());
    }
}
