//! What the NVIDIA driver reports about the GPUs: memory in use and installed, read with
//! `nvidia-smi`, which comes with the driver. Nothing is read where there is no driver.
//!
//! `nvidia-smi -i` counts GPUs in its own order, CUDA in the order `CUDA_VISIBLE_DEVICES` gives:
//! `cuda:N` is the N-th entry of that list when it is set (as numbers), else GPU N.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::MIB;

/// Bytes in use on the GPUs with CUDA ids `ids`, summed; none without a driver.
pub(super) fn used_bytes(ids: &[i32]) -> Option<u64> {
    query("memory.used", ids).map(|v| v.iter().sum())
}

/// Bytes installed on the GPU with CUDA id `id` (read once, then remembered); 0 without a
/// driver.
pub(super) fn total_bytes(id: i32) -> u64 {
    static TOTALS: OnceLock<Mutex<HashMap<i32, u64>>> = OnceLock::new();
    let totals = TOTALS.get_or_init(Mutex::default);
    if let Some(&known) = totals.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
        return known;
    }
    let total = query("memory.total", &[id])
        .and_then(|v| v.first().copied())
        .unwrap_or(0);
    totals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, total);
    total
}

/// One `nvidia-smi --query-gpu=FIELD` figure (MiB) per GPU, in bytes.
fn query(field: &str, ids: &[i32]) -> Option<Vec<u64>> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let list = ids
        .iter()
        .map(|&id| driver_index(id, visible.as_deref()).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out = std::process::Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={field}"),
            "--format=csv,noheader,nounits",
            "-i",
            &list,
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    mib_lines(&String::from_utf8_lossy(&out.stdout))
}

/// The driver's index of CUDA device `id`, given `CUDA_VISIBLE_DEVICES`.
fn driver_index(id: i32, visible: Option<&str>) -> String {
    let listed = visible.and_then(|v| {
        let ids: Vec<&str> = v.split(',').map(str::trim).collect();
        let numeric = ids.iter().all(|s| s.parse::<u32>().is_ok());
        numeric
            .then(|| usize::try_from(id).ok().and_then(|i| ids.get(i)).copied())
            .flatten()
    });
    listed.map_or_else(|| id.to_string(), str::to_string)
}

/// Parses `--format=csv,noheader,nounits` lines of MiB into bytes; none if any is not a number.
fn mib_lines(text: &str) -> Option<Vec<u64>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse::<u64>().ok().map(|mib| mib * MIB))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_lines_parse_and_bad_output_is_unknown() {
        assert_eq!(
            mib_lines("1024\n 512 \n"),
            Some(vec![1024 * MIB, 512 * MIB])
        );
        assert_eq!(mib_lines("[N/A]\n"), None);
    }

    #[test]
    fn cuda_ids_follow_cuda_visible_devices() {
        assert_eq!(driver_index(1, None), "1");
        assert_eq!(driver_index(1, Some("3,5")), "5");
        assert_eq!(driver_index(0, Some("GPU-8f2c")), "0");
        assert_eq!(driver_index(4, Some("3,5")), "4");
    }
}
