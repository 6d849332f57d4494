//! The socket connection a [`crate::Client`] and the channels opened through it share: one
//! blocking [`wic_proto::client::Client`] behind a mutex, so requests from several threads are
//! serialised on the one socket.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard, TryLockError};

use wic_proto::client::{Client as ProtoClient, ClientError};
use wic_proto::message::{Reply, Request};

/// The socket connection, shared by a [`crate::Client`] and its channels.
#[derive(Debug)]
pub(crate) struct Connection(Mutex<ProtoClient>);

impl Connection {
    pub(crate) fn new(client: ProtoClient) -> Self {
        Self(Mutex::new(client))
    }

    fn lock(&self) -> Result<MutexGuard<'_, ProtoClient>, ClientError> {
        // A poisoned lock means a request panicked halfway: the stream may hold half a frame,
        // so the connection cannot be trusted any more.
        self.0
            .lock()
            .map_err(|_| ClientError::Io(io::Error::other("an earlier request on this connection failed mid-way")))
    }

    /// Sends `request` and returns the reply.
    pub(crate) fn call(&self, request: &Request) -> Result<Reply, ClientError> {
        self.lock()?.call(request)
    }

    /// Sends `request` and returns the reply with the descriptors passed along.
    pub(crate) fn call_with_fds(&self, request: &Request) -> Result<(Reply, Vec<OwnedFd>), ClientError> {
        self.lock()?.call_with_fds(request)
    }

    /// Sends `request` with `pass` attached and returns the reply.
    pub(crate) fn call_passing(&self, request: &Request, pass: &[BorrowedFd<'_>]) -> Result<Reply, ClientError> {
        self.lock()?.call_passing(request, pass).map(|(reply, _)| reply)
    }

    /// Whether the daemon has hung up. Never blocks: while another thread is in the middle of
    /// a request, that request will notice a dead daemon itself, so this answers `false`.
    pub(crate) fn daemon_gone(&self) -> bool {
        match self.0.try_lock() {
            Ok(client) => client.daemon_gone(),
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().daemon_gone(),
            Err(TryLockError::WouldBlock) => false,
        }
    }
}
