//! Locks that outlive a panic elsewhere.
//!
//! A mutex is poisoned when a thread panicked while holding it. Every lock in this workspace
//! guards state that stays consistent between statements (counters, maps, queues, log lines),
//! so the right answer to poison is to keep going with the data as it is: a guest's trap or a
//! failed test thread must not turn every later lock into a second panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering the guard if another thread panicked while holding it.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::lock;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_poisoned_lock_still_yields_its_data() {
        let shared = Arc::new(Mutex::new(vec![1]));
        let poisoner = Arc::clone(&shared);
        let joined = std::thread::spawn(move || {
            let mut guard = lock(&poisoner);
            guard.push(2);
            panic!("a thread dies holding the lock");
        })
        .join();
        assert!(joined.is_err());
        assert!(shared.is_poisoned());
        assert_eq!(*lock(&shared), vec![1, 2]);
    }
}
