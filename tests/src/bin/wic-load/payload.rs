//! What each message carries, so that the consumer can check every byte and tell a lost, late
//! or duplicated message from the one it expects: a header naming the message (its stream and
//! sequence number) and when it was published, then words derived from that name.

use std::time::Instant;

use wic_emu::payload::splitmix64;

/// Which stream a message belongs to: one channel of one client in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    pub client: u32,
    pub round: u32,
    pub channel: u32,
}

impl Stream {
    fn key(self) -> u64 {
        (u64::from(self.client) << 40) ^ (u64::from(self.round) << 20) ^ u64::from(self.channel)
    }
}

/// Header words: the stream's key, the sequence number, the publish time.
const HEADER_WORDS: usize = 3;

/// The body words, from the message's name.
fn body_word(stream: Stream, sequence: u64, index: usize) -> u64 {
    splitmix64(stream.key() ^ splitmix64(sequence) ^ (index as u64).rotate_left(48))
}

/// Nanoseconds since `epoch`, the clock every message's publish time is read on.
pub fn stamp(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Fills `buf` (a whole slot, a multiple of 8 bytes) with message `sequence` of `stream`,
/// published at `published_ns`.
pub fn fill(buf: &mut [u8], stream: Stream, sequence: u64, published_ns: u64) {
    for (index, word) in buf.chunks_exact_mut(8).enumerate() {
        let value = match index {
            0 => stream.key(),
            1 => sequence,
            2 => published_ns,
            _ => body_word(stream, sequence, index),
        };
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// Checks that `buf` is message `sequence` of `stream`, byte for byte, and returns its publish
/// time.
pub fn check(buf: &[u8], stream: Stream, sequence: u64) -> Result<u64, String> {
    let words: Vec<u64> =
        buf.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8 bytes"))).collect();
    if words.len() < HEADER_WORDS {
        return Err(format!("{} bytes, too short for a message", buf.len()));
    }
    if words[0] != stream.key() {
        return Err(format!("message of another stream (key {:#x}, expected {:#x})", words[0], stream.key()));
    }
    if words[1] != sequence {
        return Err(format!("message {} where {sequence} was due: lost or duplicated", words[1]));
    }
    if let Some(index) = (HEADER_WORDS..words.len()).find(|&i| words[i] != body_word(stream, sequence, i)) {
        return Err(format!("message {sequence}: byte {} onwards corrupted", index * 8));
    }
    Ok(words[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: Stream = Stream { client: 3, round: 2, channel: 1 };

    #[test]
    fn a_message_checks_and_gives_back_its_publish_time() {
        let mut buf = vec![0u8; 4096];
        fill(&mut buf, STREAM, 7, 12345);
        assert_eq!(check(&buf, STREAM, 7), Ok(12345));
    }

    #[test]
    fn wrong_stream_sequence_or_bytes_are_caught() {
        let mut buf = vec![0u8; 4096];
        fill(&mut buf, STREAM, 7, 1);
        assert!(check(&buf, Stream { channel: 2, ..STREAM }, 7).unwrap_err().contains("another stream"));
        assert!(check(&buf, STREAM, 8).unwrap_err().contains("lost or duplicated"));
        buf[4000] ^= 1;
        assert!(check(&buf, STREAM, 7).unwrap_err().contains("byte 4000"));
    }
}
