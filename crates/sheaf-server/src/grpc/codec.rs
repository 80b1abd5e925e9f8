//! The protobuf codec of the gRPC service and client: prost's, with a decode buffer sized for
//! tensors.
//!
//! tonic gathers each incoming message into one buffer. With prost's default 8 KiB buffer, an
//! image-sized tensor (600 KB) that arrives in one HTTP/2 frame is copied into the buffer, and
//! then copied again when tonic reserves room for the whole message behind the bytes already
//! there. A buffer of [`DECODE_BUFFER_BYTES`] takes messages of up to half that size with the
//! one copy. The buffer's pages are touched only as far as a message fills them.

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The buffer each message is read into: messages up to half of it are copied once.
pub const DECODE_BUFFER_BYTES: usize = 2 << 20;

/// prost's codec with a tensor-sized decode buffer; encoding is prost's own.
#[derive(Debug, Clone, Default)]
pub struct TensorCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for TensorCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        // The yield threshold applies to encoding only; this is tonic's default.
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(DECODE_BUFFER_BYTES, 32 << 10))
    }
}
