//! The socket protocol's parsing (`ffi/proto`): frame headers judged by `frame::body_len`, and
//! bodies decoded as `Request`s, as wicd's server does, and as `Response`s, as the client does.
//!
//! The input's first 4 bytes are the receiver's frame limit; the rest is the byte stream,
//! taken frame by frame as the server's session loop takes it. A header must get exactly the
//! verdict the framing rules give; whatever a body decodes to must encode and decode back to
//! itself, with the same bytes the second time, and fit a frame.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use wic_proto::frame::{self, FrameError, HEADER_BYTES};
use wic_proto::message::{Request, Response};

/// Decodes `body` as `server.rs` (`session`) decodes requests and `client.rs` (`call_passing`)
/// decodes responses; anything that decodes must round-trip.
fn check_round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(body: &[u8]) {
    let Ok(decoded) = serde_json::from_slice::<T>(body) else { return };
    let encoded = serde_json::to_vec(&decoded).expect("a decoded message encodes");
    let again: T = serde_json::from_slice(&encoded).unwrap_or_else(|e| panic!("{decoded:?} encoded as {:?}: {e}", String::from_utf8_lossy(&encoded)));
    assert_eq!(again, decoded);
    assert_eq!(serde_json::to_vec(&again).expect("encodes"), encoded, "a message's encoding changed on a round trip");
    let framed = frame::encode(&encoded);
    let header = framed[..HEADER_BYTES].try_into().expect("a frame starts with its header");
    assert_eq!(frame::body_len(header, usize::MAX), Ok(encoded.len()));
}

fuzz_target!(|data: &[u8]| {
    let Some((limit, mut stream)) = data.split_first_chunk::<HEADER_BYTES>() else { return };
    let max = u32::from_le_bytes(*limit) as usize;
    while let Some((header, rest)) = stream.split_first_chunk::<HEADER_BYTES>() {
        let announced = u32::from_le_bytes(*header) as usize;
        let len = match frame::body_len(*header, max) {
            Ok(len) => {
                assert!(len == announced && len != 0 && len <= max, "{header:?} accepted as {len} under {max}");
                len
            }
            Err(FrameError::Empty) => {
                assert_eq!(announced, 0);
                // The server answers an empty frame and reads on.
                stream = rest;
                continue;
            }
            Err(FrameError::TooLarge { len, max: limit }) => {
                assert!(len == announced && limit == max && len > max, "{header:?} refused as {len} over {limit}");
                // The server answers and hangs up.
                return;
            }
        };
        // A body cut short ends the connection.
        let Some(body) = rest.get(..len) else { return };
        check_round_trip::<Request>(body);
        check_round_trip::<Response>(body);
        stream = &rest[len..];
    }
});
