//! The server's side of a model that runs other models (Triton's BLS): a request from a
//! model's own thread goes through the manager like any protocol's request (found or loaded,
//! queued, batched with the model's other traffic), and its outputs come back by name.

use std::sync::{Arc, Weak};

use sheaf_backend::{DataType, ModelCaller, Tensor};

use super::ModelManager;
use crate::request::{ByteTensor, NamedTensor, RawRequest};

/// A [`ModelCaller`] over a manager, for the backends' [`sheaf_backend::Callback`].
pub fn caller(manager: &Arc<ModelManager>) -> Arc<dyn ModelCaller> {
    Arc::new(ManagerCaller {
        manager: Arc::downgrade(manager),
        runtime: tokio::runtime::Handle::current(),
    })
}

/// Holds the manager weakly: the manager holds the backends, which hold this.
struct ManagerCaller {
    manager: Weak<ModelManager>,
    runtime: tokio::runtime::Handle,
}

impl ModelCaller for ManagerCaller {
    fn call(
        &self,
        model: &str,
        version: Option<&str>,
        inputs: Vec<(String, Tensor)>,
        outputs: Vec<String>,
    ) -> Result<Vec<(String, Tensor)>, String> {
        let manager = self
            .manager
            .upgrade()
            .ok_or("the server is shutting down")?;
        let mut raw = RawRequest {
            outputs: (!outputs.is_empty()).then_some(outputs),
            ..RawRequest::default()
        };
        for (name, tensor) in inputs {
            // Byte strings take the protocols' path, so that an image model decodes them.
            if tensor.dtype() == DataType::Bytes {
                let shape = tensor.shape().to_vec();
                let bytes =
                    ByteTensor::from_wire(name, shape, tensor.data()).map_err(|e| e.message)?;
                raw.byte_inputs.push(bytes);
            } else {
                raw.inputs.push(NamedTensor { name, tensor });
            }
        }
        let answer = self.runtime.block_on(async {
            let handle = manager.get_or_load(model, version).await?;
            manager.infer(&handle, raw).await
        });
        let response = answer.map_err(|e| e.message)?;
        let mut named: Vec<(String, Tensor)> = response
            .outputs
            .into_iter()
            .map(|t| (t.name, t.tensor))
            .collect();
        for b in response.byte_outputs {
            let tensor = Tensor::new(DataType::Bytes, b.shape.clone(), b.to_wire())
                .map_err(|e| e.to_string())?;
            named.push((b.name, tensor));
        }
        Ok(named)
    }
}
