//! Latency as a function of batch size.

use std::time::Duration;

use serde::Deserialize;

/// A batch's latency in milliseconds: either `a + b·batch`, or points joined linearly and
/// extended past both ends along the nearest segment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum CostCurve {
    Linear { a: f64, b: f64 },
    Points { points: Vec<(f64, f64)> },
}

impl CostCurve {
    /// Checks the curve is usable: at least two points with distinct, increasing batch sizes.
    pub fn check(&self) -> Result<(), String> {
        match self {
            CostCurve::Linear { a, b } if *a < 0.0 || *b < 0.0 => {
                Err("latency a and b must be >= 0".into())
            }
            CostCurve::Linear { .. } => Ok(()),
            CostCurve::Points { points } => {
                if points.len() < 2 {
                    return Err("latency points need at least two [batch, ms] pairs".into());
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

    pub fn latency(&self, batch: usize, scale: f64) -> Duration {
        Duration::from_secs_f64(self.millis(batch) * scale / 1000.0)
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
}
