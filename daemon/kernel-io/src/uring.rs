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
    /// The commands of each chunk queued, by its io_uring user data.
    chunks: Vec<Range<usize>>,
}

impl UringSubmitter {
    /// A submitter for batches of up to `max_commands` commands per chunk (the module's limit).
    pub fn new(max_commands: u32) -> io::Result<Self> {
        Ok(Self { ring: IoUring::new(64)?, max_commands: max_commands.max(1) as usize, chunks: Vec::new() })
    }

    /// Runs `commands` on the session `fd`, in order; each command gets its result. Returns how
    /// many succeeded, or the first refusal of a chunk, after which no later chunk runs.
    ///
    /// The chunks are linked (`IOSQE_IO_LINK`): a chunk longer than the module runs inline goes
    /// to one of io_uring's workers, and unlinked ones would run in any order, and at once, as
    /// the module runs batches of several submitters together; a chunk's completion and its
    /// replay in the next chunk would then race.
    pub fn submit(&mut self, fd: BorrowedFd<'_>, commands: &mut [WicCommand]) -> io::Result<usize> {
        match self.submit_chain(fd, commands)? {
            (_, Some(errno)) => Err(io::Error::from_raw_os_error(errno)),
            (succeeded, None) => Ok(succeeded),
        }
    }

    /// [`UringSubmitter::submit`], with the first refusal returned beside the count: the
    /// commands after it get `-ECANCELED`.
    fn submit_chain(&mut self, fd: BorrowedFd<'_>, commands: &mut [WicCommand]) -> io::Result<(usize, Option<i32>)> {
        let mut succeeded = 0;
        // At most a queue's worth of chunks at a time, one chain each.
        let group = self.ring.params().sq_entries() as usize * self.max_commands;
        for start in (0..commands.len()).step_by(group) {
            self.push_chain(fd, commands, start..(start + group).min(commands.len()), false)?;
            let (done, refused) = self.reap(commands)?;
            succeeded += done;
            if refused.is_some() {
                let end = (start + group).min(commands.len());
                commands[end..].iter_mut().for_each(|c| c.result = -libc::ECANCELED);
                return Ok((succeeded, refused));
            }
        }
        Ok((succeeded, None))
    }

    /// Runs the `lanes` of `commands` at once, each lane's commands in order, and returns when
    /// all are done; each command gets its result, a command of a chunk the module refused its
    /// errno and one that never ran (after a refused chunk in its lane, or one io_uring
    /// cancelled) `-ECANCELED`, so that none is taken for done. Returns how many succeeded; an
    /// error only when io_uring itself failed.
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
        let chunks: usize = lanes.iter().map(|lane| lane.len().div_ceil(max_commands)).sum();
        if chunks <= self.ring.params().sq_entries() as usize {
            for (i, lane) in lanes.iter().enumerate() {
                self.push_chain(fd, commands, lane.clone(), i + 1 < lanes.len())?;
            }
            return self.reap(commands).map(|(succeeded, _)| succeeded);
        }
        let mut succeeded = 0;
        for lane in lanes {
            // A refusal is said in the results of its commands.
            succeeded += self.submit_chain(fd, &mut commands[lane.clone()])?.0;
        }
        Ok(succeeded)
    }

    /// Queues `range` of `commands` as one chain of chunks, its head on a worker if `on_worker`.
    /// The queue is empty when it is called (every call reaps all it queued), and a chain is at
    /// most a queue's worth of chunks.
    fn push_chain(
        &mut self,
        fd: BorrowedFd<'_>,
        commands: &mut [WicCommand],
        range: Range<usize>,
        on_worker: bool,
    ) -> io::Result<()> {
        let count = range.len().div_ceil(self.max_commands);
        for (i, start) in range.clone().step_by(self.max_commands).enumerate() {
            let chunk = start..(start + self.max_commands).min(range.end);
            let mut cmd = [0u8; 16];
            cmd[..8].copy_from_slice(&(commands[chunk.clone()].as_mut_ptr() as u64).to_ne_bytes());
            cmd[8..12].copy_from_slice(&(chunk.len() as u32).to_ne_bytes());
            let mut flags = squeue::Flags::empty();
            if i + 1 < count {
                flags |= squeue::Flags::IO_LINK;
            }
            if i == 0 && on_worker {
                flags |= squeue::Flags::ASYNC;
            }
            let entry = opcode::UringCmd16::new(types::Fd(fd.as_raw_fd()), WIC_IOC_SUBMIT)
                .cmd(cmd)
                .build()
                .flags(flags)
                .user_data(self.chunks.len() as u64);
            // SAFETY: the entry carries its payload by value; the commands it points to are
            // borrowed mutably by the caller until every completion is reaped (`reap`).
            unsafe { self.ring.submission().push(&entry) }.map_err(|_| io::Error::other("submission queue full"))?;
            self.chunks.push(chunk);
        }
        Ok(())
    }

    /// Submits what is queued and reaps every chunk's completion, refusals included, so that
    /// none is left for the next batch. The commands of a chunk that did not run get its
    /// errno: the module's refusal, or `-ECANCELED` (after a refused chunk of its chain, or
    /// cancelled by io_uring). Returns the commands that succeeded and the first refusal.
    fn reap(&mut self, commands: &mut [WicCommand]) -> io::Result<(usize, Option<i32>)> {
        let count = self.chunks.len();
        let (mut succeeded, mut refused, mut reaped) = (0, None, 0);
        while reaped < count {
            match self.ring.submit_and_wait(count - reaped) {
                // Interrupted by a signal: whatever the kernel took is in flight, the rest is
                // still queued, and both are seen to on the next turn.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of memory for a request, or completions to reap first: reaped below,
                // then asked again.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    std::thread::yield_now()
                }
                Err(e) => {
                    // io_uring itself failed: what it still holds is lost to this submitter.
                    self.chunks.clear();
                    return Err(e);
                }
                Ok(_) => {}
            }
            for cqe in self.ring.completion() {
                reaped += 1;
                let Some(chunk) = self.chunks.get(cqe.user_data() as usize) else { continue };
                match cqe.result() {
                    n if n >= 0 => succeeded += n as usize,
                    errno => {
                        commands[chunk.clone()].iter_mut().for_each(|c| c.result = errno);
                        if errno != -libc::ECANCELED {
                            refused = refused.or(Some(-errno));
                        }
                    }
                }
            }
        }
        self.chunks.clear();
        Ok((succeeded, refused))
    }
}
