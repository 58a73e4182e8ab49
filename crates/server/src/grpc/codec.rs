//! The KServe v2 service's message codec: prost's, with the first buffer of each message read and each answer
//! written 4 KiB where tonic's is 8 KiB. A block of 8 KiB is past the largest the allocator's thread caches keep
//! (4 KiB, `.cargo/config.toml`), so the two buffers of every unary call took the arena's lock to be allocated and
//! again to be freed; a digits message and its answer are a few hundred bytes. A larger message grows its buffer as
//! before.

use std::marker::PhantomData;

use tonic::codec::BufferSettings;
use tonic_prost::prost::Message;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first buffer of each message read and each answer written.
const BUFFER_BYTES: usize = 4096;

/// tonic's own: how much of a stream's answers is encoded before it is sent.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// prost's codec with smaller first buffers, named by the generated service (`crates/server/build.rs`).
pub struct Codec<T, U>(PhantomData<fn(T) -> U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::new(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }
}
