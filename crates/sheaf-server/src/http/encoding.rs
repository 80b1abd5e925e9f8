//! Request bodies sent compressed (`Content-Encoding: gzip` or `deflate`, as tritonclient's
//! `request_compression_algorithm` and Triton's HTTP frontend take them): decompressed by the
//! gate once the compressed body is read, no larger than the body limit (413 past it, without
//! inflating the rest), so that every route reads the body as if it had been sent plain. Any
//! other coding is a 415 naming the two taken, in `Accept-Encoding` as well.
//!
//! Answers of the KServe infer route go back compressed when the request's `Accept-Encoding`
//! asks for gzip or deflate ([`compression`]), as Triton's HTTP frontend sends them to
//! tritonclient's `response_compression_algorithm`.

use std::io::Read;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, StatusCode};

/// The infer route's answers compressed as the request's `Accept-Encoding` prefers (gzip or
/// deflate, its quality values weighed; zlib's default level, as Triton's), and sent plain when
/// it names neither. Server-sent events and bodies of 32 bytes or less stay plain. The
/// `Inference-Header-Content-Length` of a binary answer counts the JSON header before
/// compression, as the client reads it once the body is inflated.
pub fn compression() -> tower_http::compression::CompressionLayer {
    tower_http::compression::CompressionLayer::new()
}

/// The codings taken, as `Accept-Encoding` lists them.
pub const ACCEPTED: &str = "gzip, deflate";

/// `body` decompressed as `headers`' `Content-Encoding` says, at most `limit` bytes; the body
/// itself when it names none (or `identity`).
pub async fn decompress(
    headers: &HeaderMap,
    body: Bytes,
    limit: usize,
) -> Result<Bytes, (StatusCode, String)> {
    let Some(coding) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(body);
    };
    let coding = coding.to_str().unwrap_or("").trim().to_ascii_lowercase();
    let gzip = match coding.as_str() {
        "" | "identity" => return Ok(body),
        "gzip" | "x-gzip" => true,
        "deflate" => false,
        other => {
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "Content-Encoding '{}' is not taken: send the body plain, gzip or deflate",
                    sheaf_core::clip(other)
                ),
            ))
        }
    };
    // Inflating is CPU work of its own: off the I/O threads.
    let inflated = tokio::task::spawn_blocking(move || inflate(&body, gzip, limit))
        .await
        .map_err(|e| {
            let message = format!("decompressing the body stopped: {e}");
            (StatusCode::INTERNAL_SERVER_ERROR, message)
        })?;
    inflated.map(Bytes::from)
}

/// The gzip (else zlib, HTTP's `deflate`) stream `compressed`, inflated to at most `limit`
/// bytes.
fn inflate(compressed: &[u8], gzip: bool, limit: usize) -> Result<Vec<u8>, (StatusCode, String)> {
    let decoder: Box<dyn Read> = if gzip {
        Box::new(flate2::read::MultiGzDecoder::new(compressed))
    } else {
        Box::new(flate2::read::ZlibDecoder::new(compressed))
    };
    let mut out = Vec::new();
    let read = decoder.take(limit as u64 + 1).read_to_end(&mut out);
    let name = if gzip { "gzip" } else { "deflate" };
    match read {
        Err(e) => Err((
            StatusCode::BAD_REQUEST,
            format!("the body is not valid {name} data: {e}"),
        )),
        Ok(_) if out.len() > limit => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the {name} body inflates past the length limit of {limit} bytes"),
        )),
        Ok(_) => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn encoded(coding: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, coding.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn gzip_and_deflate_bodies_are_inflated_within_the_limit() {
        let plain = b"{\"inputs\": []}".repeat(100);
        for (coding, body) in [("gzip", gzip(&plain)), ("deflate", zlib(&plain))] {
            let out = decompress(&encoded(coding), body.into(), 1 << 20)
                .await
                .unwrap();
            assert_eq!(&out[..], &plain[..], "{coding}");
        }
        let as_is = decompress(&HeaderMap::new(), Bytes::from_static(b"x"), 1)
            .await
            .unwrap();
        assert_eq!(&as_is[..], b"x");
        // A small body that inflates far: refused at the limit.
        let bomb = gzip(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 20_000);
        let (status, why) = decompress(&encoded("gzip"), bomb.into(), 1 << 20)
            .await
            .unwrap_err();
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{why}");
        let (status, why) = decompress(&encoded("gzip"), Bytes::from_static(b"nope"), 100)
            .await
            .unwrap_err();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}");
        assert!(why.contains("not valid gzip"), "{why}");
        let (status, why) = decompress(&encoded("br"), Bytes::new(), 100)
            .await
            .unwrap_err();
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{why}");
    }
}
