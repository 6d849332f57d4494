//! Command batches through io_uring: one `IORING_OP_URING_CMD` per chunk of commands, all
//! chunks of a batch submitted with one system call and linked, so that they run in order.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, squeue, types, IoUring};
use wic_kabi::{WicCommand, WicSubmit, WIC_IOC_SUBMIT};

/// A ring used only to submit command batches to `/dev/wic`.
pub struct UringSubmitter {
    ring: IoUring,
    max_commands: usize,
    payloads: Vec<WicSubmit>,
}

impl UringSubmitter {
    /// A submitter for batches of up to `max_commands` commands per chunk (the module's limit).
    pub fn new(max_commands: u32) -> io::Result<Self> {
        Ok(Self { ring: IoUring::new(64)?, max_commands: max_commands.max(1) as usize, payloads: Vec::new() })
    }

    /// Runs `commands` on the session `fd`, in order; each command gets its result. Returns how
    /// many succeeded, or the first refusal of a chunk, after which no later chunk runs.
    ///
    /// The chunks are linked (`IOSQE_IO_LINK`): a chunk longer than the module runs inline goes
    /// to one of io_uring's workers, and unlinked ones would run in any order, and at once, as
    /// the module runs batches of several submitters together; a chunk's completion and its
    /// replay in the next chunk would then race.
    pub fn submit(&mut self, fd: BorrowedFd<'_>, commands: &mut [WicCommand]) -> io::Result<usize> {
        self.payloads.clear();
        self.payloads.extend(commands.chunks_mut(self.max_commands).map(|chunk| WicSubmit {
            commands: chunk.as_mut_ptr() as u64,
            count: chunk.len() as u32,
            flags: 0,
        }));
        let mut succeeded = 0;
        let mut refused = None;
        for group in self.payloads.chunks(self.ring.params().sq_entries() as usize) {
            for (i, payload) in group.iter().enumerate() {
                let mut cmd = [0u8; 16];
                cmd[..8].copy_from_slice(&payload.commands.to_ne_bytes());
                cmd[8..12].copy_from_slice(&payload.count.to_ne_bytes());
                let link = if i + 1 < group.len() { squeue::Flags::IO_LINK } else { squeue::Flags::empty() };
                let entry =
                    opcode::UringCmd16::new(types::Fd(fd.as_raw_fd()), WIC_IOC_SUBMIT).cmd(cmd).build().flags(link);
                // SAFETY: the entry carries its payload by value; the commands it points to
                // are borrowed mutably until every completion is reaped below.
                unsafe { self.ring.submission().push(&entry) }
                    .map_err(|_| io::Error::other("submission queue full"))?;
            }
            // Every completion is reaped, refusals included, so none is left for the next batch.
            let mut reaped = 0;
            while reaped < group.len() {
                // Interrupted by a signal: whatever the kernel took is in flight, the rest is
                // still queued, and both are seen to on the next turn.
                match self.ring.submit_and_wait(group.len() - reaped) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    submitted => submitted?,
                };
                for cqe in self.ring.completion() {
                    reaped += 1;
                    match cqe.result() {
                        n if n >= 0 => succeeded += n as usize,
                        // The chunks after a refused one, never run.
                        errno if errno == -libc::ECANCELED => {}
                        errno => refused = refused.or(Some(-errno)),
                    }
                }
            }
            if refused.is_some() {
                break;
            }
        }
        if let Some(errno) = refused {
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(succeeded)
    }
}
