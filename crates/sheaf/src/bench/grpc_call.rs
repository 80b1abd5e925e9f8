//! One `ModelInfer` call of `sheaf bench`, with the request encoded once and its tensors sent
//! as they are.
//!
//! tonic's generated client encodes every message into a fresh buffer, which copies each
//! tensor on each call: 600 KB for an image. Where the load generator shares the cores with
//! the server, that copy is measured as the server's time. Here a request's gRPC message is
//! encoded once, as its small fields followed by each raw content behind its protobuf key and
//! length, and every call sends those pieces as HTTP/2 data frames that share the prepared
//! bytes. The call goes through tonic's channel, and the answer is decoded by tonic.

use std::future::poll_fn;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use http_body_util::StreamBody;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use sheaf_server::grpc::pb;
use tonic::client::GrpcService;
use tonic::codec::{BufferSettings, Streaming};
use tonic::codegen::http;
use tonic::transport::Channel;
use tonic::Status;

/// `ModelInferRequest.raw_input_contents` in proto/grpc_service.proto.
const RAW_INPUT_CONTENTS: u32 = 7;

/// The service method, as gRPC names it in the request's path.
const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// A `ModelInferRequest` in its gRPC frame, in pieces that each call shares.
#[derive(Debug, Clone)]
pub struct PreparedInfer {
    pieces: Vec<Bytes>,
}

impl PreparedInfer {
    /// Encodes `message` once. Fails for a message over gRPC's 4 GiB frame.
    pub fn new(mut message: pb::ModelInferRequest) -> anyhow::Result<PreparedInfer> {
        let contents = std::mem::take(&mut message.raw_input_contents);
        let fields = message.encoded_len();
        let length =
            fields + prost::encoding::bytes::encoded_len_repeated(RAW_INPUT_CONTENTS, &contents);
        let length = u32::try_from(length)
            .map_err(|_| anyhow::anyhow!("a request of {length} bytes is over gRPC's 4 GiB"))?;
        // The frame's header, the fields, and a key and a length of at most 6 bytes per content.
        let mut head = BytesMut::with_capacity(5 + fields + 6 * contents.len());
        // The gRPC frame: not compressed, then the message's length.
        head.put_u8(0);
        head.put_u32(length);
        message.encode(&mut head)?;
        let mut pieces = Vec::with_capacity(2 * contents.len() + 1);
        for content in contents {
            encode_key(RAW_INPUT_CONTENTS, WireType::LengthDelimited, &mut head);
            encode_varint(content.len() as u64, &mut head);
            pieces.push(head.split().freeze());
            pieces.push(content);
        }
        if !head.is_empty() {
            pieces.push(head.freeze());
        }
        Ok(PreparedInfer { pieces })
    }

    /// Sends the request on `channel`, with `metadata` (`authorization`, and the headers
    /// `--header` gives); the answer, or its status.
    pub async fn call(
        &self,
        channel: &mut Channel,
        metadata: &http::HeaderMap,
    ) -> Result<pb::ModelInferResponse, Status> {
        let frames: Vec<_> = self
            .pieces
            .iter()
            .map(|piece| Ok::<_, Status>(Frame::data(piece.clone())))
            .collect();
        let body = tonic::body::Body::new(StreamBody::new(futures::stream::iter(frames)));
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(MODEL_INFER)
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        for (name, value) in metadata {
            request = request.header(name, value);
        }
        let request = request
            .body(body)
            .map_err(|e| Status::internal(format!("cannot build the request: {e}")))?;
        poll_fn(|cx| GrpcService::poll_ready(channel, cx))
            .await
            .map_err(|e| Status::from_error(e.into()))?;
        let response = GrpcService::call(channel, request)
            .await
            .map_err(|e| Status::from_error(e.into()))?;
        // A trailers-only answer carries its status in the headers.
        if let Some(status) = Status::from_header_map(response.headers()) {
            if status.code() != tonic::Code::Ok {
                return Err(status);
            }
        }
        let code = response.status();
        let decoder = tonic_prost::ProstCodec::<(), pb::ModelInferResponse>::raw_decoder(
            BufferSettings::default(),
        );
        let mut answer = Streaming::new_response(decoder, response.into_body(), code, None, None);
        let message = answer
            .message()
            .await?
            .ok_or_else(|| Status::internal("the server sent no answer"))?;
        answer.trailers().await?;
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(contents: Vec<Bytes>) -> pb::ModelInferRequest {
        pb::ModelInferRequest {
            model_name: "mean".into(),
            id: "7".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "x".into(),
                datatype: "FP32".into(),
                shape: vec![1, 4],
                ..Default::default()
            }],
            raw_input_contents: contents,
            ..Default::default()
        }
    }

    fn decode(prepared: &PreparedInfer) -> (u8, u32, pb::ModelInferRequest) {
        let wire: Vec<u8> = prepared.pieces.concat();
        let length = u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]);
        assert_eq!(wire.len(), 5 + length as usize);
        let message = pb::ModelInferRequest::decode(&wire[5..]).unwrap();
        (wire[0], length, message)
    }

    #[test]
    fn the_pieces_are_the_message_in_its_grpc_frame() {
        let contents = vec![
            Bytes::from(vec![1u8; 16]),
            Bytes::new(),
            Bytes::from(vec![2u8; 300]),
        ];
        let message = request(contents.clone());
        let prepared = PreparedInfer::new(message.clone()).unwrap();
        let (compressed, length, decoded) = decode(&prepared);
        assert_eq!(compressed, 0);
        assert_eq!(length as usize, message.encoded_len());
        assert_eq!(decoded, message);
        // The tensors travel as the caller's own bytes, not copies.
        for content in contents.iter().filter(|c| !c.is_empty()) {
            assert!(prepared
                .pieces
                .iter()
                .any(|p| p.as_ptr() == content.as_ptr() && p.len() == content.len()));
        }
    }

    #[test]
    fn a_request_without_raw_contents_is_one_piece() {
        let message = request(vec![]);
        let prepared = PreparedInfer::new(message.clone()).unwrap();
        assert_eq!(prepared.pieces.len(), 1);
        assert_eq!(decode(&prepared).2, message);
    }
}
