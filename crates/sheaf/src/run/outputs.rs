//! Where a job's answers go, in input order, in its output folder:
//! - each tensor output as `<output>.npy` (shape: the job's items, then one item's shape);
//! - each image output (`image_outputs`) as one file per item in `<output>/`, named after the
//!   input image or numbered;
//! - other byte strings (classes, `--classes K`) as `<output>.jsonl`, one item per line.
//!
//! `progress.json` records how many items are written, after each chunk is on disk; a rerun of
//! the same job starts after them.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sheaf_core::{ByteTensor, InferResponse};

use super::npy::NpyOutput;
use super::strategy::{Task, Write};

/// The progress file's contents: which job, and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub model: String,
    pub inputs: Vec<String>,
    pub items: usize,
    pub done: usize,
}

impl Progress {
    const FILE: &'static str = "progress.json";

    /// The job of `model` on `inputs` (`NAME`, path), `items` long, before any is done.
    pub fn of(model: &str, inputs: &[(String, PathBuf)], items: usize) -> Progress {
        Progress {
            model: model.to_string(),
            inputs: inputs
                .iter()
                .map(|(n, p)| format!("{n}={}", p.display()))
                .collect(),
            items,
            done: 0,
        }
    }

    /// The items an earlier run of this same job wrote to `dir` (0 when none did, or when
    /// `restart`); a different job's progress there is an error.
    pub fn resume(dir: &Path, job: &Progress, restart: bool) -> anyhow::Result<usize> {
        let path = dir.join(Self::FILE);
        if restart || !path.exists() {
            return Ok(0);
        }
        let text = std::fs::read_to_string(&path)?;
        let earlier: Progress = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a progress file", path.display()))?;
        anyhow::ensure!(
            earlier.model == job.model
                && earlier.inputs == job.inputs
                && earlier.items == job.items,
            "{} belongs to another job (model '{}', inputs {:?}, {} items): give another \
             --output, or --restart to overwrite it",
            dir.display(),
            earlier.model,
            earlier.inputs,
            earlier.items
        );
        Ok(earlier.done.min(job.items))
    }

    /// Records `done` items, replacing the file at once and on the disk (a crash or a power
    /// cut leaves the old or the new).
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        sheaf_server::durable::write_whole(
            &dir.join(Self::FILE),
            &serde_json::to_vec_pretty(self)?,
        )?;
        Ok(())
    }
}

/// Writes a tensor job's answers.
pub struct Outputs {
    dir: PathBuf,
    progress: Progress,
    /// Items already written when this run began (kept from an earlier run).
    kept: usize,
    first: usize,
    chunk: usize,
    batching: bool,
    /// The input images' names, for image outputs.
    names: Option<Vec<String>>,
    /// Image outputs and their file extension.
    images: HashMap<String, &'static str>,
    npy: HashMap<String, NpyOutput>,
    jsonl: HashMap<String, File>,
    bar: ProgressBar,
}

impl Outputs {
    /// Opens `dir` for `progress`'s job, which resumes after `kept` items.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dir: &Path,
        progress: Progress,
        kept: usize,
        chunk: usize,
        batching: bool,
        names: Option<Vec<String>>,
        images: HashMap<String, &'static str>,
    ) -> anyhow::Result<Outputs> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let bar = progress_bar(progress.items as u64, kept as u64);
        Ok(Outputs {
            dir: dir.to_path_buf(),
            progress,
            kept,
            first: kept,
            chunk,
            batching,
            names,
            images,
            npy: HashMap::new(),
            jsonl: HashMap::new(),
            bar,
        })
    }

    /// Ends the progress bar.
    pub fn finish(&self) {
        self.bar.finish();
    }

    fn npy(
        &mut self,
        name: &str,
        tensor: &sheaf_backend::Tensor,
    ) -> anyhow::Result<&mut NpyOutput> {
        if !self.npy.contains_key(name) {
            let shape = tensor.shape();
            let item = if self.batching { &shape[1..] } else { shape };
            let path = self.dir.join(format!("{name}.npy"));
            let out =
                NpyOutput::create(&path, tensor.dtype(), self.progress.items, item, self.kept)?;
            self.npy.insert(name.to_string(), out);
        }
        let out = self
            .npy
            .get_mut(name)
            .context("an output file went missing")?;
        let shape = tensor.shape();
        let item = if self.batching { &shape[1..] } else { shape };
        anyhow::ensure!(
            item == out.item_shape.as_slice() && tensor.dtype() == out.dtype,
            "output '{name}' changed shape between chunks ({:?}, then {item:?}); NPY needs one \
             item shape",
            out.item_shape
        );
        Ok(out)
    }

    fn jsonl(&mut self, name: &str) -> anyhow::Result<&mut File> {
        if !self.jsonl.contains_key(name) {
            let path = self.dir.join(format!("{name}.jsonl"));
            let file = open_lines(&path, self.kept)?;
            self.jsonl.insert(name.to_string(), file);
        }
        self.jsonl
            .get_mut(name)
            .context("an output file went missing")
    }

    /// The file name of item `i`'s image.
    fn image_name(&self, i: usize, ext: &str) -> String {
        match &self.names {
            Some(names) => format!("{}.{ext}", names[i]),
            None => {
                let width = self.progress.items.max(1).to_string().len();
                format!("{i:0width$}.{ext}")
            }
        }
    }
}

impl Write<InferResponse> for Outputs {
    fn write(&mut self, k: usize, response: InferResponse) -> Task<'_, ()> {
        // Writing is file I/O: off the async threads.
        Box::pin(async move { tokio::task::block_in_place(|| self.write_now(k, &response)) })
    }
}

impl Outputs {
    fn write_now(&mut self, k: usize, response: &InferResponse) -> anyhow::Result<()> {
        let start = self.first + k * self.chunk;
        let count = self.chunk.min(self.progress.items - start);
        for output in &response.outputs {
            if output.name == sheaf_core::frames::FRAME_IDS {
                continue;
            }
            let data = output.tensor.data();
            self.npy(&output.name, &output.tensor)?
                .write_at(start, data)?;
        }
        for output in &response.byte_outputs {
            let per_item = strings_per_item(output, count)?;
            if let Some(ext) = self.images.get(&output.name).copied() {
                let folder = self.dir.join(&output.name);
                std::fs::create_dir_all(&folder)?;
                for (i, image) in output.items.iter().enumerate() {
                    let path = folder.join(self.image_name(start + i, ext));
                    std::fs::write(&path, image)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
            } else {
                let mut lines = Vec::new();
                for item in output.items.chunks(per_item) {
                    let strings: Vec<String> = item
                        .iter()
                        .map(|s| String::from_utf8_lossy(s).into_owned())
                        .collect();
                    serde_json::to_writer(&mut lines, &strings)?;
                    lines.push(b'\n');
                }
                self.jsonl(&output.name)?.write_all(&lines)?;
            }
        }
        for out in self.npy.values_mut() {
            out.sync()?;
        }
        for file in self.jsonl.values_mut() {
            file.sync_data()?;
        }
        self.progress.done = start + count;
        self.progress.save(&self.dir)?;
        self.bar.inc(count as u64);
        Ok(())
    }
}

/// How many strings each of `count` items has in a batched BYTES output: the same number for
/// every item, and at least one.
pub fn strings_per_item(output: &ByteTensor, count: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(
        !output.items.is_empty() && output.items.len().is_multiple_of(count),
        "output '{}' has {} strings for {count} items",
        output.name,
        output.items.len()
    );
    Ok(output.items.len() / count)
}

/// A bar over `items`, `done` of them already done: items/s and the time left.
pub fn progress_bar(items: u64, done: u64) -> ProgressBar {
    let bar = ProgressBar::new(items);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} items  {per_sec}  ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_position(done);
    bar.reset_eta();
    bar
}

/// A count of items done, for a job whose length is not known (a stream): items/s, no ETA.
pub fn counter() -> ProgressBar {
    let bar = ProgressBar::no_length();
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} {pos} items  {per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Opens a JSON-lines file for appending after its first `keep` lines (the rest, written
/// after the last recorded progress, are dropped).
pub fn open_lines(path: &Path, keep: usize) -> anyhow::Result<File> {
    if keep == 0 {
        return File::create(path).with_context(|| format!("cannot create {}", path.display()));
    }
    let text = std::fs::read(path).with_context(|| format!("cannot resume {}", path.display()))?;
    let end = text
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(keep - 1)
        .map(|(i, _)| i + 1)
        .with_context(|| {
            format!(
                "{} holds fewer than {keep} lines; run with --restart",
                path.display()
            )
        })?;
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.set_len(end as u64)?;
    let mut file = std::fs::OpenOptions::new().append(true).open(path)?;
    file.flush()?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_resumes_only_the_same_job() {
        let dir = tempfile::tempdir().unwrap();
        let job = Progress {
            model: "m".into(),
            inputs: vec!["x.npy".into()],
            items: 10,
            done: 4,
        };
        assert_eq!(Progress::resume(dir.path(), &job, false).unwrap(), 0);
        job.save(dir.path()).unwrap();
        assert_eq!(Progress::resume(dir.path(), &job, false).unwrap(), 4);
        assert_eq!(Progress::resume(dir.path(), &job, true).unwrap(), 0);
        let other = Progress { items: 11, ..job };
        let e = Progress::resume(dir.path(), &other, false).unwrap_err();
        assert!(e.to_string().contains("another job"), "{e}");
    }

    #[test]
    fn lines_past_the_recorded_progress_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("y.jsonl");
        std::fs::write(&path, "a\nb\nc\n").unwrap();
        let mut f = open_lines(&path, 2).unwrap();
        f.write_all(b"d\n").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\nd\n");
        assert!(open_lines(&path, 9).is_err());
    }
}
