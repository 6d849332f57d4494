//! The words a warp finds instead of data when its request cannot be served.

/// What a warp finds in its page instead of data when its request cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorMarker {
    /// The producer did not publish within the channel's timeout.
    Timeout = 1,
    /// The channel was closed (client exit, explicit destroy) while the warp waited.
    ChannelClosed = 2,
    /// The daemon is shutting down.
    DaemonStopping = 3,
    /// The daemon died with the fault held: the kernel module completed it (never written by
    /// the engine, read by the device side).
    DaemonGone = 4,
}

impl ErrorMarker {
    /// The 64-bit word written at the start of every page of the run: a magic in the high half
    /// (unlikely in real data) and the code in the low half. The device library checks it.
    pub const MAGIC: u64 = 0x5749_4345_0000_0000; // "WICE"

    /// The marker word for this error.
    pub const fn word(self) -> u64 {
        Self::MAGIC | self as u64
    }

    /// Decodes a marker word, if it is one.
    pub fn from_word(word: u64) -> Option<Self> {
        match word {
            w if w == Self::Timeout.word() => Some(Self::Timeout),
            w if w == Self::ChannelClosed.word() => Some(Self::ChannelClosed),
            w if w == Self::DaemonStopping.word() => Some(Self::DaemonStopping),
            w if w == Self::DaemonGone.word() => Some(Self::DaemonGone),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_words_round_trip_and_reject_data() {
        for m in
            [ErrorMarker::Timeout, ErrorMarker::ChannelClosed, ErrorMarker::DaemonStopping, ErrorMarker::DaemonGone]
        {
            assert_eq!(ErrorMarker::from_word(m.word()), Some(m));
        }
        assert_eq!(ErrorMarker::from_word(0), None);
        assert_eq!(ErrorMarker::from_word(ErrorMarker::MAGIC), None);
        assert_eq!(ErrorMarker::from_word(ErrorMarker::MAGIC | 5), None);
    }
}
