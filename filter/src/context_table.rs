//! The VM's live streams by context id. The host numbers contexts from one counter per VM,
//! so the streams alive at once have nearby ids: a stream lives in the slot its id's low
//! bits pick, found there with one comparison; only a stream whose slot is taken by an
//! older one that is still alive goes to the overflow list, kept in id order and searched by
//! halving (a `BTreeMap` would do as well, with 8 KB more code for V8 to compile in every
//! worker). No allocation per stream, no hashing, no boxed trait object. Generic over the
//! stream so it is tested natively.

/// Slots for streams; a power of two, above the streams one worker usually has in flight.
pub const SLOTS: usize = 64;

pub struct ContextTable<T> {
    slots: Vec<Option<(u32, T)>>,
    /// In id order; the host's ids grow, so a new one usually goes at the end.
    overflow: Vec<(u32, T)>,
}

impl<T> Default for ContextTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Where `id` is in the overflow list, or where it would go.
fn find<T>(overflow: &[(u32, T)], id: u32) -> Result<usize, usize> {
    overflow.binary_search_by_key(&id, |(held, _)| *held)
}

impl<T> ContextTable<T> {
    pub fn new() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| None).collect(),
            overflow: Vec::new(),
        }
    }

    fn slot(id: u32) -> usize {
        id as usize % SLOTS
    }

    /// Adds `id`, replacing a stream already held under the same id.
    pub fn insert(&mut self, id: u32, value: T) {
        // `get_mut` rather than indexing: the slot always exists, and no panic path is built.
        match self.slots.get_mut(Self::slot(id)) {
            Some(slot @ None) => {
                // An id the host re-creates while it waits in the overflow list is one
                // stream: the old one goes, or it would outlive its removal.
                if let Ok(at) = find(&self.overflow, id) {
                    self.overflow.remove(at);
                }
                *slot = Some((id, value));
            }
            Some(Some((held, v))) if *held == id => *v = value,
            _ => match find(&self.overflow, id) {
                Ok(at) => {
                    if let Some(held) = self.overflow.get_mut(at) {
                        held.1 = value;
                    }
                }
                Err(at) => self.overflow.insert(at, (id, value)),
            },
        }
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut T> {
        match self.slots.get_mut(Self::slot(id)) {
            Some(Some((held, value))) if *held == id => Some(value),
            _ => match find(&self.overflow, id) {
                Ok(at) => self.overflow.get_mut(at).map(|(_, v)| v),
                Err(_) => None,
            },
        }
    }

    pub fn remove(&mut self, id: u32) -> Option<T> {
        match self.slots.get_mut(Self::slot(id)) {
            Some(slot) if slot.as_ref().is_some_and(|(held, _)| *held == id) => {
                slot.take().map(|(_, v)| v)
            }
            _ => match find(&self.overflow, id) {
                Ok(at) => Some(self.overflow.remove(at).1),
                Err(_) => None,
            },
        }
    }

    /// Streams held, in slots and in the overflow list.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count() + self.overflow.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 5, 69 and 133 share one slot.
    const SAME_SLOT: [u32; 3] = [5, 5 + SLOTS as u32, 5 + 2 * SLOTS as u32];

    #[test]
    fn ids_sharing_a_slot_are_kept_apart_whatever_the_order() {
        let [a, b, c] = SAME_SLOT;
        let mut t = ContextTable::new();
        t.insert(a, "a");
        t.insert(b, "b");
        t.insert(c, "c");
        assert_eq!(t.len(), 3);
        for (id, want) in [(a, "a"), (b, "b"), (c, "c")] {
            assert_eq!(t.get_mut(id).copied(), Some(want));
        }
        // The overflow's entry goes first, then the slot's, then the last overflow entry.
        assert_eq!(t.remove(b), Some("b"));
        assert_eq!(t.get_mut(b), None);
        assert_eq!(t.get_mut(a).copied(), Some("a"));
        assert_eq!(t.get_mut(c).copied(), Some("c"));
        assert_eq!(t.remove(a), Some("a"));
        assert_eq!(t.get_mut(a), None);
        assert_eq!(t.get_mut(c).copied(), Some("c"));
        assert_eq!(t.remove(c), Some("c"));
        assert_eq!(t.remove(c), None);
        assert!(t.is_empty());
    }

    #[test]
    fn a_slot_freed_while_the_overflow_holds_its_neighbour_serves_both() {
        let [a, b, c] = SAME_SLOT;
        let mut t = ContextTable::new();
        t.insert(a, 1);
        t.insert(b, 2); // to the overflow: a holds the slot
        assert_eq!(t.remove(a), Some(1));
        // b is still found in the overflow although its slot is free.
        assert_eq!(t.get_mut(b).copied(), Some(2));
        // A new id takes the free slot; b stays reachable.
        t.insert(c, 3);
        assert_eq!(t.get_mut(c).copied(), Some(3));
        assert_eq!(t.get_mut(b).copied(), Some(2));
        if let Some(v) = t.get_mut(b) {
            *v = 20;
        }
        assert_eq!(t.remove(b), Some(20));
        assert_eq!(t.remove(c), Some(3));
        assert_eq!((t.remove(a), t.remove(b)), (None, None));
        assert!(t.is_empty());
    }

    #[test]
    fn overflow_ids_come_in_any_order() {
        let ids: Vec<u32> = (1..=6).map(|k| 7 + k * SLOTS as u32).collect();
        let mut t = ContextTable::new();
        t.insert(7, 0);
        for &id in ids.iter().rev() {
            t.insert(id, id);
        }
        t.insert(ids[2], 1000); // replaces, does not add
        assert_eq!(t.len(), 7);
        for &id in &ids {
            let want = if id == ids[2] { 1000 } else { id };
            assert_eq!(t.get_mut(id).copied(), Some(want));
        }
        assert_eq!(t.remove(ids[4]), Some(ids[4]));
        assert_eq!(t.get_mut(ids[4]), None);
        assert_eq!(t.get_mut(ids[5]).copied(), Some(ids[5]));
        assert_eq!(t.get_mut(7).copied(), Some(0));
    }

    #[test]
    fn unknown_ids_and_other_slots_are_not_confused() {
        let mut t = ContextTable::new();
        for id in 1..=200 {
            t.insert(id, id * 10);
        }
        assert_eq!(t.len(), 200);
        assert_eq!(t.get_mut(0), None);
        assert_eq!(t.get_mut(201), None);
        for id in (1..=200).rev().step_by(3) {
            assert_eq!(t.remove(id), Some(id * 10));
        }
        for id in 1..=200 {
            let _ = t.remove(id);
        }
        assert!(t.is_empty());
    }

    #[test]
    fn a_stream_recreated_under_a_live_overflow_id_is_held_once_and_gone_when_removed() {
        let [a, b, _] = SAME_SLOT;
        let mut t = ContextTable::new();
        t.insert(a, 1);
        t.insert(b, 2); // to the overflow: a holds the slot
        assert_eq!(t.remove(a), Some(1));
        // The host creates `b` again while it is live: "replacing a stream already held".
        t.insert(b, 3);
        assert_eq!(t.len(), 1, "b is held twice");
        assert_eq!(t.remove(b), Some(3));
        assert_eq!(
            t.get_mut(b),
            None,
            "the replaced stream outlives its removal"
        );
        assert!(t.is_empty());
    }
}
