//! A simulated device, so scheduling can be measured and tested without a GPU.
//!
//! A sim model is a `model.sim.yaml` file in a model folder:
//!
//! ```yaml
//! input: {name: x, shape: [-1, 4]}       # FP32; -1 first = batch dimension
//! output: {name: y}                      # same shape as the input; y = 2x + 1
//! latency_ms: {points: [[1, 35], [4, 52]]}   # or {a: 29.3, b: 5.67}: t(b) = a + b·batch
//! time_scale: 1.0                        # multiplies every latency (0.001 turns s into ms)
//! memory_mb: 512                         # declared device memory
//! serving_memory_mb: 768                 # declared once it has run a batch (default: memory_mb)
//! ```
//!
//! A batch takes exactly the curve's time (sleeping the instance thread), and the outputs are a
//! fixed function of the inputs, so a scheduler test can still check that every item got its own
//! answer. It never stands in for a real model where model correctness is claimed.
#![forbid(unsafe_code)]

mod curve;
mod model;

pub use curve::CostCurve;
pub use model::{SimBackend, SimModel, SimSpec};
