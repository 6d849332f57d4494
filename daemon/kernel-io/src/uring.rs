//! Command batches through io_uring: one `IORING_OP_URING_CMD` per chunk of commands, all
//! chunks of a batch submitted with one system call. The chunks of one lane are linked, so that
//! they run in order; lanes run at once.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, squeue, types, IoUring};
use wic_kabi::{WicCommand, WIC_IOC_SUBMIT};

/// A ring used only to submit command batches to `/dev/wic`.
pub struct UringSubmitter {
    ring: IoUring,
    max_commands: usize,
}

impl UringSubmitter {
    /// A submitter for batches of up to `max_commands` commands per chunk (the module's limit).
    pub fn new(max_commands: u32) -> io::Result<Self> {
        Ok(Self { ring: IoUring::new(64)?, max_commands: max_commands.max(1) as usize })
    }

    /// Runs `commands` on the session `fd`, in order; each command gets its result. Returns how
    /// many succeeded, or the first refusal of a chunk, after which no later chunk runs.
    ///
    /// The chunks are linked (`IOSQE_IO_LINK`): a chunk longer than the module runs inline goes
    /// to one of io_uring's workers, and unlinked ones would run in any order, and at once, as
    /// the module runs batches of several submitters together; a chunk's completion and its
    /// replay in the next chunk would then race.
    pub fn submit(&mut self, fd: BorrowedFd<'_>, commands: &mut [WicCommand]) -> io::Result<usize> {
        let whole = 0..commands.len();
        self.submit_lanes(fd, commands, std::slice::from_ref(&whole))
    }

    /// Runs the `lanes` of `commands` at once, each lane's commands in order, and returns when
    /// all are done; each command gets its result. Returns how many succeeded, or the first
    /// refusal of a chunk (a lane ends at its refused chunk, the others run to their end).
    ///
    /// Every lane but the last starts on one of io_uring's workers (`IOSQE_ASYNC`), and the
    /// last one from this thread, so that the module runs them together; a lane of several
    /// chunks is a chain of them. Lanes that would not fit in the submission queue together
    /// run one after another.
    pub fn submit_lanes(
        &mut self,
        fd: BorrowedFd<'_>,
        commands: &mut [WicCommand],
        lanes: &[Range<usize>],
    ) -> io::Result<usize> {
        let max_commands = self.max_commands;
        let chunks = |lane: &Range<usize>| lane.len().div_ceil(max_commands);
        let queue = self.ring.params().sq_entries() as usize;
        if lanes.len() > 1 && lanes.iter().map(chunks).sum::<usize>() <= queue {
            for (i, lane) in lanes.iter().enumerate() {
                self.push_chain(fd, &mut commands[lane.clone()], i + 1 < lanes.len())?;
            }
            let (succeeded, refused) = self.reap(lanes.iter().map(chunks).sum());
            return refused.map_or(Ok(succeeded), |errno| Err(io::Error::from_raw_os_error(errno)));
        }
        let mut succeeded = 0;
        for lane in lanes {
            // At most a queue's worth of chunks at a time, one chain each.
            for group in commands[lane.clone()].chunks_mut(queue * self.max_commands) {
                let count = group.len().div_ceil(self.max_commands);
                self.push_chain(fd, group, false)?;
                let (done, refused) = self.reap(count);
                succeeded += done;
                if let Some(errno) = refused {
                    return Err(io::Error::from_raw_os_error(errno));
                }
            }
        }
        Ok(succeeded)
    }

    /// Queues `commands` as one chain of chunks, its head on a worker if `on_worker`.
    fn push_chain(&mut self, fd: BorrowedFd<'_>, commands: &mut [WicCommand], on_worker: bool) -> io::Result<()> {
        let count = commands.len().div_ceil(self.max_commands);
        for (i, chunk) in commands.chunks_mut(self.max_commands).enumerate() {
            let mut cmd = [0u8; 16];
            cmd[..8].copy_from_slice(&(chunk.as_mut_ptr() as u64).to_ne_bytes());
            cmd[8..12].copy_from_slice(&(chunk.len() as u32).to_ne_bytes());
            let mut flags = squeue::Flags::empty();
            if i + 1 < count {
                flags |= squeue::Flags::IO_LINK;
            }
            if i == 0 && on_worker {
                flags |= squeue::Flags::ASYNC;
            }
            let entry =
                opcode::UringCmd16::new(types::Fd(fd.as_raw_fd()), WIC_IOC_SUBMIT).cmd(cmd).build().flags(flags);
            // SAFETY: the entry carries its payload by value; the commands it points to are
            // borrowed mutably by the caller until every completion is reaped (`reap`).
            unsafe { self.ring.submission().push(&entry) }.map_err(|_| io::Error::other("submission queue full"))?;
        }
        Ok(())
    }

    /// Submits what is queued and reaps `count` completions, refusals included, so that none is
    /// left for the next batch: the commands that succeeded, and the first refusal's errno.
    fn reap(&mut self, count: usize) -> (usize, Option<i32>) {
        let (mut succeeded, mut refused, mut reaped) = (0, None, 0);
        while reaped < count {
            // Interrupted by a signal: whatever the kernel took is in flight, the rest is still
            // queued, and both are seen to on the next turn.
            match self.ring.submit_and_wait(count - reaped) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return (succeeded, refused.or(e.raw_os_error()).or(Some(libc::EIO))),
                Ok(_) => {}
            }
            for cqe in self.ring.completion() {
                reaped += 1;
                match cqe.result() {
                    n if n >= 0 => succeeded += n as usize,
                    // The chunks after a refused one in its chain, never run.
                    errno if errno == -libc::ECANCELED => {}
                    errno => refused = refused.or(Some(-errno)),
                }
            }
        }
        (succeeded, refused)
    }
}
