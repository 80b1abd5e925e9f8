//! Generates the gRPC types and services from proto/ (KServe v2's, and text-embeddings-inference's
//! `tei.v1`), with a vendored protoc so that no system protobuf compiler is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Raw tensor contents become `bytes::Bytes`, shared with the tensors without a copy.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .bytes(".inference.InferTensorContents.bytes_contents")
        .compile_protos(&["proto/grpc_service.proto", "proto/tei.proto"], &["proto"])?;
    Ok(())
}
