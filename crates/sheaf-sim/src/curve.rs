//! Latency as a function of batch size.

use std::time::Duration;

use serde::Deserialize;

/// The longest latency a curve may give a batch: an hour, in milliseconds (a curve extended
/// past its points is held there).
pub const MAX_MS: f64 = 3_600_000.0;

/// A batch's latency in milliseconds: either `a + b·batch`, or points joined linearly and
/// extended past both ends along the nearest segment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CostCurve {
    Linear { a: f64, b: f64 },
    Points { points: Vec<(f64, f64)> },
}

impl CostCurve {
    /// Checks the curve is usable: numbers from 0 to an hour of milliseconds ([`MAX_MS`]), and
    /// at least two points with distinct, increasing batch sizes.
    pub fn check(&self) -> Result<(), String> {
        let within = |v: f64| (0.0..=MAX_MS).contains(&v);
        match self {
            CostCurve::Linear { a, b } if !within(*a) || !within(*b) => Err(format!(
                "latency a and b must be numbers from 0 to {MAX_MS} (ms)"
            )),
            CostCurve::Linear { .. } => Ok(()),
            CostCurve::Points { points } => {
                if points.len() < 2 {
                    return Err("latency points need at least two [batch, ms] pairs".into());
                }
                if points.iter().any(|&(x, ms)| !x.is_finite() || !within(ms)) {
                    return Err(format!(
                        "latency points are [batch, ms] pairs of numbers, the ms from 0 to {MAX_MS}"
                    ));
                }
                if points.windows(2).any(|w| w[1].0 <= w[0].0) {
                    return Err("latency points must have increasing batch sizes".into());
                }
                Ok(())
            }
        }
    }

    /// Latency of a batch of `batch` items, in milliseconds.
    pub fn millis(&self, batch: usize) -> f64 {
        let x = batch as f64;
        match self {
            CostCurve::Linear { a, b } => a + b * x,
            CostCurve::Points { points } => {
                let i = points
                    .iter()
                    .position(|p| p.0 >= x)
                    .unwrap_or(points.len() - 1)
                    .max(1);
                let (x0, y0) = points[i - 1];
                let (x1, y1) = points[i];
                (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(0.0)
            }
        }
    }

    /// Latency of a batch of `batch` items, scaled by `scale` (positive and finite), at most
    /// [`MAX_MS`] before scaling.
    pub fn latency(&self, batch: usize, scale: f64) -> Duration {
        Duration::from_secs_f64(self.millis(batch).clamp(0.0, MAX_MS) * scale / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_interpolate_and_extend() {
        let c = CostCurve::Points {
            points: vec![(1.0, 35.0), (4.0, 52.0)],
        };
        assert_eq!(c.millis(1), 35.0);
        assert_eq!(c.millis(4), 52.0);
        assert!((c.millis(2) - 40.666).abs() < 0.01);
        assert!((c.millis(7) - 69.0).abs() < 1e-9);
        let seed001 = CostCurve::Points {
            points: vec![(1.0, 15000.0), (8.0, 40000.0)],
        };
        assert_eq!(seed001.latency(8, 0.001), Duration::from_millis(40));
    }

    #[test]
    fn linear_and_checks() {
        assert_eq!(CostCurve::Linear { a: 2.0, b: 0.5 }.millis(4), 4.0);
        assert!(CostCurve::Points {
            points: vec![(1.0, 1.0)]
        }
        .check()
        .is_err());
        assert!(CostCurve::Points {
            points: vec![(2.0, 1.0), (1.0, 2.0)]
        }
        .check()
        .is_err());
    }

    /// Numbers no duration holds are refused at load (a point of 1e300 ms panicked the loader),
    /// and a curve extended far past its points is held at an hour a batch.
    #[test]
    fn latencies_are_numbers_a_duration_holds() {
        for points in [
            vec![(1.0, 1e300), (64.0, 1e300)],
            vec![(1.0, f64::NAN), (64.0, 1.0)],
            vec![(1.0, -5.0), (64.0, 1.0)],
            vec![(f64::NAN, 1.0), (64.0, 1.0)],
        ] {
            let error = CostCurve::Points { points }.check().unwrap_err();
            assert!(error.contains("the ms from 0 to 3600000"), "{error}");
        }
        for (a, b) in [(f64::INFINITY, 1.0), (1.0, f64::NAN), (-1.0, 1.0)] {
            assert!(CostCurve::Linear { a, b }.check().is_err(), "{a} {b}");
        }
        let steep = CostCurve::Points {
            points: vec![(1.0, 0.0), (2.0, MAX_MS)],
        };
        assert!(steep.check().is_ok());
        assert_eq!(steep.latency(usize::MAX, 2.0), Duration::from_secs(7200));
    }
}
