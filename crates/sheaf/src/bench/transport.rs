//! How `sheaf bench` sends one request: HTTP with JSON or binary tensors, or gRPC.
//! Requests are built once per input frame and reused; only the frame index varies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Value};
use sheaf_backend::DataType;
use sheaf_server::grpc::pb;
use tonic::transport::Channel;

use super::grpc_call::PreparedInfer;
use super::{Encoding, InputShape};

/// Where a request stands in its sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Start,
    Middle,
    End,
}

/// What a benchmark's request bodies are made of: the inputs, the frames, the encoding.
type Source = (Vec<InputShape>, Vec<Frame>, Encoding);

/// One prepared request per input frame.
pub enum Transport {
    Http {
        client: reqwest::Client,
        url: String,
        bodies: Arc<Vec<(Bytes, Option<usize>)>>,
        /// What the bodies were made of, for requests whose parameters vary (sequences).
        source: Option<Arc<Source>>,
    },
    Grpc {
        /// One channel per connection; each clone of the transport takes the next one.
        channels: Arc<Vec<Channel>>,
        next: Arc<AtomicUsize>,
        channel: Channel,
        requests: Arc<Vec<PreparedInfer>>,
        /// The metadata sent with each request: `authorization`, and `--header`'s.
        metadata: Arc<reqwest::header::HeaderMap>,
    },
}

/// gRPC connections `sheaf bench` opens. One HTTP/2 connection is served by one task on each
/// side, so the load spreads over several, as the HTTP client's pool spreads it.
const GRPC_CONNECTIONS: usize = 8;

impl Clone for Transport {
    fn clone(&self) -> Self {
        match self {
            Transport::Http {
                client,
                url,
                bodies,
                source,
            } => Transport::Http {
                client: client.clone(),
                url: url.clone(),
                bodies: bodies.clone(),
                source: source.clone(),
            },
            Transport::Grpc {
                channels,
                next,
                channel: _,
                requests,
                metadata,
            } => Transport::Grpc {
                channels: channels.clone(),
                next: next.clone(),
                channel: channels[next.fetch_add(1, Ordering::Relaxed) % channels.len()].clone(),
                requests: requests.clone(),
                metadata: metadata.clone(),
            },
        }
    }
}

/// Every input of one request: its shape (items first) and its bytes.
pub type Frame = Vec<(Vec<usize>, Vec<u8>)>;

/// A request of encoded images: `image` as every element of the BYTES data of `input` (the
/// request's items first in its shape), and optionally the top K classes of an output.
pub struct ImageRequest {
    pub input: String,
    /// The input's shape: `items` first.
    pub shape: Vec<i64>,
    pub image: Bytes,
    /// K and the output's name.
    pub classes: Option<(usize, String)>,
}

impl ImageRequest {
    /// The BYTES elements in binary, the image as every element of the shape: each its 4-byte
    /// length, then its bytes.
    fn wire(&self) -> Bytes {
        let elements = self.shape.iter().product::<i64>().max(0) as usize;
        let mut out = Vec::with_capacity(elements * (4 + self.image.len()));
        for _ in 0..elements {
            out.extend_from_slice(&(self.image.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.image);
        }
        Bytes::from(out)
    }
}

impl Transport {
    pub fn http(
        client: reqwest::Client,
        url: String,
        inputs: &[InputShape],
        frames: &[Frame],
        encoding: Encoding,
        sequences: bool,
    ) -> Transport {
        let bodies = frames
            .iter()
            .map(|f| http_body(inputs, f, encoding, None))
            .collect();
        Transport::Http {
            client,
            url,
            bodies: Arc::new(bodies),
            source: sequences.then(|| Arc::new((inputs.to_vec(), frames.to_vec(), encoding))),
        }
    }

    /// Requests of encoded images over HTTP, binary BYTES data.
    pub fn http_image(client: reqwest::Client, url: String, image: &ImageRequest) -> Transport {
        let data = image.wire();
        let mut header = json!({"inputs": [{"name": image.input, "shape": image.shape,
            "datatype": "BYTES", "parameters": {"binary_data_size": data.len()}}]});
        if let Some((k, output)) = &image.classes {
            header["outputs"] = json!([{"name": output, "parameters": {"classification": k}}]);
        }
        let mut body = header.to_string().into_bytes();
        let length = body.len();
        body.extend_from_slice(&data);
        Transport::Http {
            client,
            url,
            bodies: Arc::new(vec![(Bytes::from(body), Some(length))]),
            source: None,
        }
    }

    /// Requests of encoded images over gRPC, raw BYTES contents.
    pub async fn grpc_image(
        url: &str,
        model: &str,
        image: &ImageRequest,
        metadata: reqwest::header::HeaderMap,
    ) -> anyhow::Result<Transport> {
        let mut t = Transport::grpc(url, model, &[], &[vec![]], metadata).await?;
        if let Transport::Grpc { requests, .. } = &mut t {
            let outputs = image
                .classes
                .iter()
                .map(
                    |(k, output)| pb::model_infer_request::InferRequestedOutputTensor {
                        name: output.clone(),
                        parameters: [(
                            "classification".to_string(),
                            pb::InferParameter {
                                parameter_choice: Some(
                                    pb::infer_parameter::ParameterChoice::Int64Param(*k as i64),
                                ),
                            },
                        )]
                        .into(),
                    },
                )
                .collect();
            *requests = Arc::new(vec![PreparedInfer::new(pb::ModelInferRequest {
                model_name: model.to_string(),
                inputs: vec![pb::model_infer_request::InferInputTensor {
                    name: image.input.clone(),
                    datatype: "BYTES".into(),
                    shape: image.shape.clone(),
                    ..Default::default()
                }],
                outputs,
                raw_input_contents: vec![image.wire()],
                ..Default::default()
            })?]);
        }
        Ok(t)
    }

    pub async fn grpc(
        url: &str,
        model: &str,
        inputs: &[InputShape],
        frames: &[Frame],
        metadata: reqwest::header::HeaderMap,
    ) -> anyhow::Result<Transport> {
        // The server's frame size and adaptive windows, so that large tensors travel in few
        // frames either way.
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())?
            .max_frame_size(sheaf_server::grpc::MAX_FRAME_BYTES)
            .http2_adaptive_window(true)
            .tcp_nodelay(true);
        let mut channels = Vec::with_capacity(GRPC_CONNECTIONS);
        for _ in 0..GRPC_CONNECTIONS {
            channels.push(endpoint.connect().await?);
        }
        let requests = frames
            .iter()
            .map(|f| {
                PreparedInfer::new(pb::ModelInferRequest {
                    model_name: model.to_string(),
                    inputs: inputs
                        .iter()
                        .zip(f)
                        .map(
                            |(i, (shape, _))| pb::model_infer_request::InferInputTensor {
                                name: i.name.clone(),
                                datatype: i.dtype.as_str().to_string(),
                                shape: shape.iter().map(|&d| d as i64).collect(),
                                ..Default::default()
                            },
                        )
                        .collect(),
                    raw_input_contents: f.iter().map(|(_, b)| Bytes::from(b.clone())).collect(),
                    ..Default::default()
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Transport::Grpc {
            channel: channels[0].clone(),
            channels: Arc::new(channels),
            next: Arc::new(AtomicUsize::new(1)),
            requests: Arc::new(requests),
            metadata: Arc::new(metadata),
        })
    }

    /// Sends the request for `frame` as a request of sequence `id` (its first with `Start`, its
    /// last with `End`); its latency in ms, or the kind of error. HTTP only.
    pub async fn send_in_sequence(
        &mut self,
        frame: usize,
        id: u64,
        place: Place,
    ) -> Result<f64, String> {
        let Transport::Http {
            source: Some(source),
            ..
        } = self
        else {
            return Err("sequences need HTTP tensors".into());
        };
        let (inputs, frames, encoding) = &**source;
        let parameters = json!({
            "sequence_id": id,
            "sequence_start": place == Place::Start,
            "sequence_end": place == Place::End,
        });
        let body = http_body(
            inputs,
            &frames[frame % frames.len()],
            *encoding,
            Some(parameters),
        );
        self.send_body(body).await
    }

    /// Sends the request for `frame`; its latency in ms, or the kind of error.
    pub async fn send(&mut self, frame: usize) -> Result<f64, String> {
        match self {
            Transport::Http { bodies, .. } => {
                let body = bodies[frame % bodies.len()].clone();
                self.send_body(body).await
            }
            Transport::Grpc {
                channel,
                requests,
                metadata,
                ..
            } => {
                let t = Instant::now();
                requests[frame % requests.len()]
                    .call(channel, metadata)
                    .await
                    .map_err(|s| format!("grpc {:?}", s.code()))?;
                Ok(t.elapsed().as_secs_f64() * 1000.0)
            }
        }
    }

    /// Posts one HTTP body (with its binary header's length); its latency in ms.
    async fn send_body(&mut self, (body, header): (Bytes, Option<usize>)) -> Result<f64, String> {
        let t = Instant::now();
        match self {
            Transport::Http { client, url, .. } => {
                let mut req = client.post(url.as_str()).body(body);
                if let Some(n) = header {
                    req = req.header("Inference-Header-Content-Length", n);
                }
                let r = req.send().await.map_err(|e| {
                    if e.is_connect() {
                        "connect".to_string()
                    } else {
                        "transport".to_string()
                    }
                })?;
                let status = r.status();
                let answer = r.bytes().await.map_err(|_| "transport".to_string())?;
                if !status.is_success() {
                    first_of_its_kind(status.as_u16(), &answer);
                    return Err(format!("http {}", status.as_u16()));
                }
            }
            Transport::Grpc { .. } => return Err("an HTTP body on a gRPC transport".into()),
        }
        Ok(t.elapsed().as_secs_f64() * 1000.0)
    }
}

/// Prints the server's message for the first error answer of each status, so that a count of
/// errors in the report comes with its reason.
fn first_of_its_kind(status: u16, body: &[u8]) {
    static SEEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let Ok(mut seen) = SEEN.lock() else { return };
    if !seen.contains(&status) {
        seen.push(status);
        let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
        eprintln!("sheaf bench: the first http {status} answer said: {text}");
    }
}

fn http_body(
    inputs: &[InputShape],
    frame: &Frame,
    encoding: Encoding,
    parameters: Option<Value>,
) -> (Bytes, Option<usize>) {
    let mut binary = Vec::new();
    let specs: Vec<Value> = inputs
        .iter()
        .zip(frame)
        .map(|(i, (shape, bytes))| match encoding {
            Encoding::Binary => {
                binary.extend_from_slice(bytes);
                json!({"name": i.name, "shape": shape, "datatype": i.dtype.as_str(),
                       "parameters": {"binary_data_size": bytes.len()}})
            }
            Encoding::Json => {
                let view = sheaf_server::kserve::json_data::DataView {
                    dtype: i.dtype,
                    bytes,
                };
                json!({"name": i.name, "shape": shape, "datatype": i.dtype.as_str(), "data": view})
            }
        })
        .collect();
    let mut header = json!({"inputs": specs});
    let mut params = parameters.unwrap_or_else(|| json!({}));
    if encoding == Encoding::Binary {
        params["binary_data_output"] = json!(true);
    }
    if params.as_object().is_some_and(|p| !p.is_empty()) {
        header["parameters"] = params;
    }
    let mut body = header.to_string().into_bytes();
    let header_length = (encoding == Encoding::Binary).then_some(body.len());
    body.extend(binary);
    (Bytes::from(body), header_length)
}

/// Pseudo-random bytes that every dtype reads as small finite values, from `seed`.
pub fn random_bytes(dtype: DataType, n: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    match dtype {
        DataType::F32 => (0..n)
            .flat_map(|_| rng.random_range(-1.0f32..1.0).to_le_bytes())
            .collect(),
        DataType::F64 => (0..n)
            .flat_map(|_| rng.random_range(-1.0f64..1.0).to_le_bytes())
            .collect(),
        other => (0..n * other.size())
            .map(|_| rng.random_range(0..2u8))
            .collect(),
    }
}
