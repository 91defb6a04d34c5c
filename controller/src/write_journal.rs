//! The journal of our own writes to copies, as the writer uses it: every write and delete is
//! recorded before it is sent and settled when it ends, so the watch events it causes wake nothing
//! (the data structure is `index::Journal`, inside the object index the watches route through); and
//! the digests of copies found up to date, so an unchanged copy costs no comparison.

use crate::{
    index::{CrRef, ObjectIndex, ObjectKey},
    wake::Wake,
};
use shared::copy::ownership::Owner;
use std::sync::{Arc, Mutex};

/// The writer's side of the object index.
#[derive(Clone)]
pub struct WriteJournal {
    index: Arc<Mutex<ObjectIndex>>,
    wake: Wake,
}

impl WriteJournal {
    /// The journal kept in `index`, waking owners through `wake`.
    pub fn new(index: Arc<Mutex<ObjectIndex>>, wake: Wake) -> Self {
        Self { index, wake }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, ObjectIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that we are about to write a copy.
    pub fn begin_write(&self, key: ObjectKey) {
        self.index().journal.begin_write(key);
    }

    /// Records how our write of a copy ended (its resourceVersion, or `None` if it failed). Events
    /// held meanwhile that were not ours wake `owner`.
    pub fn finish_write(&self, key: ObjectKey, owner: &Owner, resource_version: Option<String>) {
        let foreign = self.index().journal.finish_write(key, resource_version);
        if foreign {
            self.wake.send(CrRef::of(owner));
        }
    }

    /// Whether the copy at `key`, stored at `resource_version`, was found up to date for the desired
    /// copy of fingerprint `desired` (see `crate::cache::verified`).
    pub fn is_verified(&self, key: &ObjectKey, resource_version: &str, desired: u64) -> bool {
        self.index().verified.is_current(key, resource_version, desired)
    }

    /// Remembers that the copy at `key`, stored at `resource_version`, is up to date for the desired
    /// copy of fingerprint `desired`.
    pub fn remember_verified(&self, key: &ObjectKey, resource_version: &str, desired: u64) {
        self.index().verified.remember(key, resource_version, desired);
    }

    /// Records that we are deleting a copy, so its delete event wakes nothing.
    pub fn record_delete(&self, key: ObjectKey) {
        self.index().journal.record_delete(key);
    }
}
