//! Reads and writes waiting for (or in) a combined batch, with their replies: the bytes of a
//! queued write copied into a pooled buffer, the batch run as one `FileSystem` call, and each
//! request answered (and reported to the observer) as its result comes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use fuser::{ReplyData, ReplyWrite};

use super::kernel::errno;
use crate::batch::{DataAnswer, DataRequest};
use crate::combine::Combine;
use crate::error::FsResult;
use crate::filesystem::FileSystem;
use crate::observe::{FileOp, FileOpObserver};
use crate::store::PageStore;

/// Buffers of queued writes kept for reuse; more are freed once their writes are done.
const POOLED_BUFFERS: usize = 32;

/// The buffers queued writes copy their bytes into (a request's bytes live in its fuser
/// thread's buffer only until the thread returns).
#[derive(Default)]
pub(crate) struct BufferPool(Mutex<Vec<Vec<u8>>>);

impl BufferPool {
    fn copy_of(&self, data: &[u8]) -> Vec<u8> {
        let mut buffer =
            self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(data);
        buffer
    }

    fn give_back(&self, buffers: impl Iterator<Item = Vec<u8>>) {
        let mut pool = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for buffer in buffers {
            if pool.len() < POOLED_BUFFERS {
                pool.push(buffer);
            }
        }
    }
}

/// The bytes of a write: still in its fuser thread's buffer, or copied to be queued.
pub(super) enum Payload<'a> {
    Borrowed(&'a [u8]),
    Pooled(Vec<u8>),
}

pub(super) enum Replier {
    Data(ReplyData),
    Write(ReplyWrite),
}

/// A read or write with its reply, waiting for (or in) a batch.
pub(crate) struct Pending<'a> {
    pub(super) inode: u64,
    pub(super) offset: u64,
    /// `None` for a read, of `size` bytes.
    pub(super) payload: Option<Payload<'a>>,
    pub(super) size: usize,
    pub(super) reply: Option<Replier>,
    pub(super) started: Option<Instant>,
}

impl Pending<'_> {
    fn request(&self) -> DataRequest<'_> {
        let (inode, offset) = (self.inode, self.offset);
        match &self.payload {
            None => DataRequest::Read { inode, offset, size: self.size },
            Some(Payload::Borrowed(data)) => DataRequest::Write { inode, offset, data },
            Some(Payload::Pooled(data)) => DataRequest::Write { inode, offset, data },
        }
    }

    /// This request with its bytes copied, so that it may wait in the queue.
    pub(super) fn into_owned(self, buffers: &BufferPool) -> Pending<'static> {
        let payload = match self.payload {
            None => None,
            Some(Payload::Borrowed(data)) => Some(Payload::Pooled(buffers.copy_of(data))),
            Some(Payload::Pooled(buffer)) => Some(Payload::Pooled(buffer)),
        };
        Pending { payload, ..self }
    }
}

/// Reuses a `Vec`'s allocation for a list of another lifetime (see `filesystem::recycle`).
pub(super) fn recycle_vec<'a, 'b, T: 'a, U: 'b>(mut list: Vec<T>) -> Vec<U> {
    list.clear();
    list.into_iter().map(|_| unreachable!("cleared")).collect()
}

/// The file system with what its batches reuse: the state behind the lock.
pub(crate) struct Served<S: PageStore> {
    pub(crate) fs: FileSystem<S>,
    observer: Option<Arc<dyn FileOpObserver>>,
    buffers: Arc<BufferPool>,
    pub(super) spare_batch: Vec<Pending<'static>>,
    spare_requests: Vec<DataRequest<'static>>,
    replies: Vec<Option<(Replier, Option<Instant>)>>,
}

impl<S: PageStore> Served<S> {
    pub(crate) fn new(
        fs: FileSystem<S>,
        observer: Option<Arc<dyn FileOpObserver>>,
        buffers: Arc<BufferPool>,
    ) -> Self {
        Served {
            fs,
            observer,
            buffers,
            spare_batch: Vec::new(),
            spare_requests: Vec::new(),
            replies: Vec::new(),
        }
    }

    /// Runs the reads and writes of `batch` (in arrival order) and replies to each; leaves
    /// `batch` empty and its buffers back in the pool.
    pub(super) fn run_batch(&mut self, batch: &mut Vec<Pending<'_>>) {
        let Served { fs, observer, buffers, spare_requests, replies, .. } = self;
        replies.clear();
        replies.extend(
            batch.iter_mut().map(|pending| pending.reply.take().map(|reply| (reply, pending.started))),
        );
        let mut requests = recycle_vec(std::mem::take(spare_requests));
        requests.extend(batch.iter().map(Pending::request));
        fs.run_data_requests(&requests, &mut |index, result| {
            let (reply, started) = replies[index].take().expect("each request is answered once");
            answer(observer, reply, started, result);
        });
        *spare_requests = recycle_vec(requests);
        buffers.give_back(batch.drain(..).filter_map(|pending| match pending.payload {
            Some(Payload::Pooled(buffer)) => Some(buffer),
            _ => None,
        }));
    }
}

impl<S: PageStore> std::ops::Deref for Served<S> {
    type Target = FileSystem<S>;
    fn deref(&self) -> &FileSystem<S> {
        &self.fs
    }
}

impl<S: PageStore> std::ops::DerefMut for Served<S> {
    fn deref_mut(&mut self) -> &mut FileSystem<S> {
        &mut self.fs
    }
}

impl<S: PageStore> Combine for Served<S> {
    type Item = Pending<'static>;
    fn run(&mut self, items: &mut Vec<Pending<'static>>) {
        self.run_batch(items);
    }
}

/// Reports a request begun at `started` to the observer, if there is one.
pub(super) fn report(
    observer: &Option<Arc<dyn FileOpObserver>>,
    op: FileOp,
    started: Option<Instant>,
    bytes: u64,
    failed: bool,
) {
    if let (Some(observer), Some(started)) = (observer, started) {
        observer.file_op(op, bytes, started.elapsed(), failed);
    }
}

/// Replies to a read or write.
fn answer(
    observer: &Option<Arc<dyn FileOpObserver>>,
    reply: Replier,
    started: Option<Instant>,
    result: FsResult<DataAnswer<'_>>,
) {
    match (reply, result) {
        (Replier::Data(reply), Ok(DataAnswer::Read(bytes))) => {
            report(observer, FileOp::Read, started, bytes.len() as u64, false);
            reply.data(bytes);
        }
        (Replier::Write(reply), Ok(DataAnswer::Written(written))) => {
            report(observer, FileOp::Write, started, u64::from(written), false);
            reply.written(written);
        }
        (Replier::Data(reply), Err(error)) => {
            report(observer, FileOp::Read, started, 0, true);
            reply.error(errno(&error));
        }
        (Replier::Write(reply), Err(error)) => {
            report(observer, FileOp::Write, started, 0, true);
            reply.error(errno(&error));
        }
        (Replier::Data(_), Ok(DataAnswer::Written(_))) | (Replier::Write(_), Ok(DataAnswer::Read(_))) => {
            unreachable!("a read is answered with bytes, a write with a count")
        }
    }
}
