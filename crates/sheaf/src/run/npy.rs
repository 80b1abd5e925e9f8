//! NPY files: the tensors a job reads (a slice of items at a time, never the whole file) and
//! writes (a header for the whole job, then items appended in order).

use std::fs::File;
use std::io::{Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use npyz::WriterBuilder;
use sheaf_backend::DataType;

/// NumPy's type string of a datatype (little-endian), for the types NumPy has.
pub fn descr(dtype: DataType) -> Option<&'static str> {
    Some(match dtype {
        DataType::Bool => "|b1",
        DataType::U8 => "|u1",
        DataType::U16 => "<u2",
        DataType::U32 => "<u4",
        DataType::U64 => "<u8",
        DataType::I8 => "|i1",
        DataType::I16 => "<i2",
        DataType::I32 => "<i4",
        DataType::I64 => "<i8",
        DataType::F16 => "<f2",
        DataType::F32 => "<f4",
        DataType::F64 => "<f8",
        DataType::BF16 | DataType::Bytes => return None,
    })
}

/// The datatype of a NumPy type string; big-endian and other kinds are `None`.
fn from_descr(text: &str) -> Option<DataType> {
    let (order, kind) = text.split_at_checked(1)?;
    // "|u1" and "<u1" (and "=" on this little-endian machine) name the same type.
    if !matches!(order, "<" | "|" | "=") {
        return None;
    }
    // BF16 has no NumPy type string, so it never matches.
    DataType::ALL
        .into_iter()
        .find(|&d| descr(d).is_some_and(|ours| &ours[1..] == kind))
}

/// An NPY file open for reading items.
pub struct NpyInput {
    pub path: PathBuf,
    file: File,
    pub dtype: DataType,
    /// Items along dimension 0.
    pub items: usize,
    /// The shape of one item.
    pub item_shape: Vec<usize>,
    pub item_bytes: usize,
    offset: u64,
}

impl NpyInput {
    /// Reads the header of `path`: a C-order, little-endian array of a plain type.
    pub fn open(path: &Path) -> anyhow::Result<NpyInput> {
        let mut file =
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let header = npyz::NpyHeader::from_reader(&mut file)
            .with_context(|| format!("{}: not an NPY file", path.display()))?;
        let offset = file.stream_position()?;
        let npy = npyz::NpyFile::with_header(header, &file);
        anyhow::ensure!(
            npy.order() == npyz::Order::C,
            "{}: the array is in Fortran order; save it in C order (np.ascontiguousarray)",
            path.display()
        );
        // A plain type's string, e.g. `<f4` (`descr()` gives its Python literal, quoted).
        let descr = match npy.dtype() {
            npyz::DType::Plain(t) => t.to_string(),
            other => other.descr(),
        };
        let dtype = from_descr(&descr).with_context(|| {
            format!(
                "{}: NumPy type '{descr}' is not a little-endian number type sheaf takes",
                path.display()
            )
        })?;
        let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
        let Some((&items, item_shape)) = shape.split_first() else {
            anyhow::bail!(
                "{}: a scalar has no items along dimension 0",
                path.display()
            );
        };
        let item_bytes = item_shape
            .iter()
            .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
            .context("the item shape is too large")?;
        let need = (items as u64)
            .checked_mul(item_bytes as u64)
            .and_then(|n| n.checked_add(offset))
            .context("the array is too large")?;
        let have = file.metadata()?.len();
        anyhow::ensure!(
            have >= need,
            "{}: the header declares {items} items of {item_bytes} bytes, but the file ends \
             after {have} bytes",
            path.display()
        );
        Ok(NpyInput {
            path: path.to_path_buf(),
            file,
            dtype,
            items,
            item_shape: item_shape.to_vec(),
            item_bytes,
            offset,
        })
    }

    /// A raw file of `dtype` items of `item_shape`, back to back.
    pub fn raw(path: &Path, dtype: DataType, item_shape: Vec<usize>) -> anyhow::Result<NpyInput> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let item_bytes = item_shape.iter().product::<usize>() * dtype.size();
        anyhow::ensure!(
            item_bytes > 0,
            "an item of shape {item_shape:?} holds no data"
        );
        let len = file.metadata()?.len();
        anyhow::ensure!(
            len % item_bytes as u64 == 0,
            "{}: {len} bytes is not a whole number of {item_bytes}-byte items ({} of shape {item_shape:?})",
            path.display(),
            dtype.as_str()
        );
        Ok(NpyInput {
            path: path.to_path_buf(),
            file,
            dtype,
            items: (len / item_bytes as u64) as usize,
            item_shape,
            item_bytes,
            offset: 0,
        })
    }

    /// The bytes of items `start..start + count`.
    pub fn read(&self, start: usize, count: usize) -> anyhow::Result<Vec<u8>> {
        let mut data = vec![0u8; count * self.item_bytes];
        let at = self.offset + (start * self.item_bytes) as u64;
        self.file
            .read_exact_at(&mut data, at)
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        Ok(data)
    }
}

/// An NPY file being written: its header holds the whole job's shape, and items are appended.
pub struct NpyOutput {
    file: File,
    offset: u64,
    pub item_shape: Vec<usize>,
    pub item_bytes: usize,
    pub dtype: DataType,
}

impl NpyOutput {
    /// Creates `path` for `items` items of `item_shape`; with `keep` items already written by
    /// an earlier run (checked against the header), appends after them.
    pub fn create(
        path: &Path,
        dtype: DataType,
        items: usize,
        item_shape: &[usize],
        keep: usize,
    ) -> anyhow::Result<NpyOutput> {
        let descr = descr(dtype).with_context(|| format!("NPY has no {} type", dtype.as_str()))?;
        let item_bytes = item_shape.iter().product::<usize>() * dtype.size();
        if keep > 0 {
            let existing = NpyInput::open(path)
                .with_context(|| format!("cannot resume {}", path.display()))?;
            anyhow::ensure!(
                existing.dtype == dtype
                    && existing.items == items
                    && existing.item_shape == item_shape,
                "{} holds {} items of {:?} {}, not this job's {items} of {item_shape:?} {}: \
                 remove it, or run with --restart",
                path.display(),
                existing.items,
                existing.item_shape,
                existing.dtype.as_str(),
                dtype.as_str()
            );
            // Items past the last the progress file records are written again.
            let file = std::fs::OpenOptions::new().write(true).open(path)?;
            return Ok(NpyOutput {
                file,
                offset: existing.offset,
                item_shape: item_shape.to_vec(),
                item_bytes,
                dtype,
            });
        }
        let mut file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut shape = vec![items as u64];
        shape.extend(item_shape.iter().map(|&d| d as u64));
        let dtype_npy = npyz::DType::new_scalar(
            descr
                .parse()
                .map_err(|e| anyhow::anyhow!("NumPy type '{descr}': {e}"))?,
        );
        npyz::WriteOptions::new_header_only()
            .dtype(dtype_npy)
            .shape(&shape)
            .writer(&mut file)
            .write_header_only()?;
        let offset = file.stream_position()?;
        // The file has its whole size from the start (unwritten items read as zeros), so that
        // it is a valid NPY file while the job runs, and after it stops.
        let size = (items as u64)
            .checked_mul(item_bytes as u64)
            .and_then(|n| n.checked_add(offset))
            .context("the output is too large")?;
        file.set_len(size)?;
        Ok(NpyOutput {
            file,
            offset,
            item_shape: item_shape.to_vec(),
            item_bytes,
            dtype,
        })
    }

    /// Writes items from `start` on.
    pub fn write_at(&mut self, start: usize, data: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all_at(data, self.offset + (start * self.item_bytes) as u64)?;
        Ok(())
    }

    /// Flushes the items written so far to the disk.
    pub fn sync(&mut self) -> anyhow::Result<()> {
        self.file.flush()?;
        self.file.sync_data()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("y.npy");
        let item = |i: u32| -> Vec<u8> {
            [i as f32, i as f32 + 0.5]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        };
        let mut out = NpyOutput::create(&path, DataType::F32, 5, &[2], 0).unwrap();
        out.write_at(0, &[item(0), item(1), item(2)].concat())
            .unwrap();
        out.sync().unwrap();
        drop(out);
        // A second run keeps 2 items (the third was never recorded as done) and goes on.
        let mut out = NpyOutput::create(&path, DataType::F32, 5, &[2], 2).unwrap();
        out.write_at(2, &[item(7), item(3), item(4)].concat())
            .unwrap();
        drop(out);
        let back = NpyInput::open(&path).unwrap();
        assert_eq!(
            (back.items, back.item_shape.clone(), back.dtype),
            (5, vec![2], DataType::F32)
        );
        let all = back.read(0, 5).unwrap();
        assert_eq!(all, [item(0), item(1), item(7), item(3), item(4)].concat());
        assert_eq!(back.read(3, 2).unwrap(), [item(3), item(4)].concat());
        // A different job is not resumed into it.
        let e = NpyOutput::create(&path, DataType::F32, 6, &[2], 2)
            .err()
            .unwrap();
        assert!(e.to_string().contains("--restart"), "{e}");
    }

    #[test]
    fn type_strings_map_both_ways() {
        for d in [
            DataType::F32,
            DataType::U8,
            DataType::I64,
            DataType::Bool,
            DataType::F16,
        ] {
            assert_eq!(from_descr(descr(d).unwrap()), Some(d));
        }
        assert_eq!(from_descr("<u1"), Some(DataType::U8));
        assert_eq!(from_descr(">f4"), None);
        assert_eq!(from_descr("<c8"), None);
    }

    #[test]
    fn truncated_and_foreign_files_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.npy");
        NpyOutput::create(&path, DataType::F32, 4, &[3], 0).unwrap();
        assert_eq!(NpyInput::open(&path).unwrap().items, 4);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(file.metadata().unwrap().len() - 4).unwrap();
        let e = NpyInput::open(&path).err().unwrap();
        assert!(e.to_string().contains("file ends"), "{e}");
        std::fs::write(&path, b"not numpy").unwrap();
        assert!(NpyInput::open(&path).is_err());
        let raw = dir.path().join("x.raw");
        std::fs::write(&raw, [0u8; 10]).unwrap();
        let e = NpyInput::raw(&raw, DataType::F32, vec![2]).err().unwrap();
        assert!(e.to_string().contains("whole number"), "{e}");
    }
}
