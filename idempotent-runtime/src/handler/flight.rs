//! Coalescing: one flight per record key and handle. A call whose key is already in flight in this
//! process (through the same `Idempotency` handle, or a clone of it) makes no
//! request of its own: it *follows* the flight's *leader*, the call that is making the requests.
//!
//! - The leader passes on only what the store answered: the COMPLETED record it wrote or read
//!   ([`Landed`]: the response as stored, or none when it was too large to store; the record's
//!   fingerprint). A value that was not stored is never passed on: followers trust nothing but a
//!   stored record, or their own claim.
//! - A leader that ends any other way (its body failed or panicked, its future was dropped, the store
//!   failed, it found the key in progress elsewhere and did not wait) hands the flight over: the
//!   flight ends, and its followers join again; the first to do so leads a new flight and claims for
//!   itself, the others follow it. So one follower at a time goes on to claim, never two, never none.
//! - A follower with `wait` waits for the flight's end (up to its own deadline); one without `wait`
//!   waits only for the leader's claim to be answered, and then gets `InProgress` if the key is held
//!   (by the leader's own claim or by another process's).
//! - A call whose payload differs from the leader's does not follow it: it makes its own requests, and
//!   the store answers it (`PayloadMismatch` while the record stands).
//!
//! This file holds the flights and their pure decisions ([`follow`], [`join`]), which the model drives
//! too; what a call does with them (the claim, the replay of a landed record) is `claim.rs`'s.
//!
//! The map is sharded by the key's hash, each shard a short-held lock. A call that finds no flight
//! pays for its key's hash, one entry inserted (a copy of the key, beside its hash) and removed, and
//! the shard's lock once per step of its own (joined, claim answered, ended): the flight itself (the
//! followers' state and their `Notify`) is allocated by the first call that follows, and a call no
//! one follows never touches one (see `docs/performance-notes.md`).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

/// How many locks the map is split into: calls on different keys rarely wait for each other.
const SHARDS: usize = 16;
/// A COMPLETED record as a leader passes it to its followers: what the store holds.
#[derive(Debug)]
pub(crate) struct Landed {
    /// The stored response (as stored: JSON, compressed when large); `None` when the record is
    /// COMPLETED without one (too large to store: followers get `ResponseTooLarge`, as duplicates do).
    pub(crate) response: Option<Arc<[u8]>>,
    /// The stored record's payload fingerprint.
    pub(crate) fingerprint: Option<Arc<str>>,
}

/// Where a flight is, as its followers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// The leader's claim is on its way, or its answer is being read.
    Claiming,
    /// The key is held: by the leader's own claim (its body runs), or by another process's claim the
    /// leader waits on.
    Busy,
    /// The leader passed on a stored COMPLETED record.
    Landed,
    /// The leader ended without one: the flight is over, its followers join again.
    Vacant,
}

/// What a follower does on seeing its flight in `phase` ([`follow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Follow {
    /// Keep waiting for the flight to move on.
    Wait,
    /// Answer `InProgress` now: the key is held and the follower does not wait.
    InProgress,
    /// Answer from the landed record.
    Take,
    /// Join again: lead a new flight, or follow the one another follower leads by now.
    Rejoin,
}

/// What a follower that may wait (`waits`) does on seeing `phase`. Pure: the model drives it.
pub(crate) fn follow(phase: Phase, waits: bool) -> Follow {
    match phase {
        Phase::Claiming => Follow::Wait,
        Phase::Busy if waits => Follow::Wait,
        Phase::Busy => Follow::InProgress,
        Phase::Landed => Follow::Take,
        Phase::Vacant => Follow::Rejoin,
    }
}

/// How a call joins its key's flight ([`join`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Join {
    /// No flight: lead a new one.
    Lead,
    /// Follow the flight in the map.
    Follow,
    /// The flight's leader has another payload: make requests of its own, outside any flight.
    Alone,
}

/// How a call joins when the map holds a flight for its key (`Some(same payload)`) or none. Pure: the
/// model drives it.
pub(crate) fn join(existing: Option<bool>) -> Join {
    match existing {
        None => Join::Lead,
        Some(true) => Join::Follow,
        Some(false) => Join::Alone,
    }
}

/// When the claim holding a busy flight's key may be taken over, as its leader found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Busy {
    /// The instant (epoch milliseconds, on the handle's clock, unjudged) from which the claim may be
    /// taken over: what a duplicate reading the record would count its `retry_after` to.
    pub(crate) until_ms: u64,
    /// The claim is the leader's own, which this process renews while heartbeats are on.
    pub(crate) own: bool,
}

/// What a flight's followers see of it.
#[derive(Debug)]
struct State {
    phase: Phase,
    /// While `Busy`: when the claim holding the key may be taken over.
    busy: Option<Busy>,
    /// While `Landed`, for the followers there were when it landed.
    landed: Option<Arc<Landed>>,
}

/// A key in flight that a call follows: what its followers see of it, and how they learn it changed.
/// Allocated by the first call that follows; a leader no one follows has none.
#[derive(Debug)]
pub(crate) struct Flight {
    state: Mutex<State>,
    changed: Notify,
}

impl Flight {
    /// A flight as its first follower finds its leader: in `phase`, held until `busy` says.
    fn at(phase: Phase, busy: Option<Busy>) -> Self {
        Self {
            state: Mutex::new(State {
                phase,
                busy,
                landed: None,
            }),
            changed: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held: a poisoned lock's state is whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, phase: Phase, busy: Option<Busy>, landed: Option<Arc<Landed>>) {
        {
            let mut state = self.state();
            state.phase = phase;
            state.busy = busy;
            state.landed = landed;
        }
        self.changed.notify_waiters();
    }
}

/// A key in flight, as the map holds it (found by the key's hash).
#[derive(Debug)]
struct Slot {
    /// The key itself: two keys with the same hash are never taken for one (the second goes alone).
    key: Box<str>,
    /// A hash of the leader's payload fingerprint (0 without one): whom it may lead. A collision only
    /// lets a call with another payload follow, and a follower still checks the landed record's own
    /// fingerprint.
    payload: u64,
    /// Where the leader is, until a call follows (then its flight says).
    phase: Phase,
    /// While `Busy`, until a call follows: when the claim holding the key may be taken over.
    busy: Option<Busy>,
    /// The flight its followers follow, from the first one on.
    flight: Option<Arc<Flight>>,
}

/// A hasher for keys that are hashes already (the map's `u64`s): it passes them through.
#[derive(Debug, Default, Clone, Copy)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; any other input is folded in rather than dropped.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A shard's entries, by their keys' hashes.
type Table = HashMap<u64, Slot, BuildHasherDefault<Prehashed>>;

type Shard = Mutex<Table>;

/// The keys in flight through one handle (shared by the handles derived from it).
pub(crate) struct Flights {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for Flights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flights").finish_non_exhaustive()
    }
}

impl Default for Flights {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

/// How a call joined its key's flight.
#[derive(Debug)]
pub(crate) enum Joined<'a> {
    /// It leads a new flight.
    Lead(Lead<'a>),
    /// It follows this flight.
    Follow(Arc<Flight>),
    /// It goes alone (its payload differs from the leader's, or another key of the same hash is in
    /// flight).
    Alone,
}

impl Flights {
    /// The shard of a key hashed to `hash`. Chosen by bits the shard's own table does not use for
    /// its buckets (the low ones) or its tags (the top seven).
    fn shard(&self, hash: u64) -> MutexGuard<'_, Table> {
        let index = usize::try_from((hash >> 32) % SHARDS as u64).unwrap_or(0);
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `key`'s hash, never 0 (a [`Lead`]'s mark for "no longer leads").
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key).max(1)
    }

    /// Joins `key`'s flight as a call with `fingerprint`: leads a new one, follows the one in flight,
    /// or goes alone ([`join`]).
    pub(crate) fn join(&self, key: &str, fingerprint: Option<&str>) -> Joined<'_> {
        let hash = self.hash(key);
        let payload = fingerprint.map_or(0, |f| self.hasher.hash_one(f));
        let mut shard = self.shard(hash);
        let slot = shard.get_mut(&hash);
        // Another key with the same hash in flight: no coalescing for this call.
        if slot.as_ref().is_some_and(|slot| *slot.key != *key) {
            return Joined::Alone;
        }
        match join(slot.as_ref().map(|slot| slot.payload == payload)) {
            Join::Follow => {
                let slot = slot.expect("a flight to follow");
                let (phase, busy) = (slot.phase, slot.busy);
                let flight = slot
                    .flight
                    .get_or_insert_with(|| Arc::new(Flight::at(phase, busy)));
                Joined::Follow(Arc::clone(flight))
            }
            Join::Alone => Joined::Alone,
            Join::Lead => {
                shard.insert(
                    hash,
                    Slot {
                        key: key.into(),
                        payload,
                        phase: Phase::Claiming,
                        busy: None,
                        flight: None,
                    },
                );
                Joined::Lead(Lead {
                    flights: self,
                    hash: AtomicU64::new(hash),
                })
            }
        }
    }

    /// Moves the flight of the key hashed to `hash` on to `phase`: its followers' flight if there is
    /// one (and `wake` says it moved), else the map's entry, for a follower still to come.
    fn update(
        &self,
        hash: u64,
        phase: Phase,
        busy: Option<Busy>,
        wake: impl FnOnce(&Flight) -> bool,
    ) {
        let flight = {
            let mut shard = self.shard(hash);
            let Some(slot) = shard.get_mut(&hash) else {
                return;
            };
            let Some(flight) = &slot.flight else {
                slot.phase = phase;
                slot.busy = busy;
                return;
            };
            Arc::clone(flight)
        };
        if wake(&flight) {
            flight.set(phase, busy, None);
        }
    }

    /// Takes the key hashed to `hash` out of the map (no call joins its flight from now on), and
    /// returns the flight, if any call followed.
    fn end(&self, hash: u64) -> Option<Arc<Flight>> {
        self.shard(hash).remove(&hash)?.flight
    }
}

/// The leader's hold on its flight. Dropped without having [`land`](Lead::land)ed (the call ended
/// without a stored COMPLETED record, its future was dropped, it panicked), it hands the flight over.
///
/// It names its flight by the key's hash: while a lead holds it, the map's entry at that hash is its
/// own (a call with another key of the same hash goes alone, and only the lead removes its entry).
#[derive(Debug)]
pub(crate) struct Lead<'a> {
    flights: &'a Flights,
    /// The key's hash; 0 once the flight ended (landed) or the hold moved into an owned one
    /// ([`Lead::into_owned`]). Atomic only so that a lead can be shared while its call is polled.
    hash: AtomicU64,
}

impl Lead<'_> {
    /// The key's hash, while this hold still leads.
    fn hash(&self) -> Option<u64> {
        Some(self.hash.load(Ordering::Relaxed)).filter(|&hash| hash != 0)
    }

    /// This hold, owned, for a detached body's task (`flights` is the map it was taken from, shared):
    /// the flight goes on while the body runs, whether or not its caller still waits.
    pub(crate) fn into_owned(self, flights: &Arc<Flights>) -> OwnedLead {
        OwnedLead {
            flights: Arc::clone(flights),
            hash: self.hash.swap(0, Ordering::Relaxed),
        }
    }

    /// The key is held (by the leader's own claim, or by another process's it waits on) until `busy`
    /// says. Followers without `wait` answer `InProgress`.
    pub(crate) fn busy(&self, busy: Busy) {
        if let Some(hash) = self.hash() {
            self.flights.update(hash, Phase::Busy, Some(busy), |_| true);
        }
    }

    /// The leader's claim is on its way again (it re-claims a key it found claimable).
    pub(crate) fn claiming(&self) {
        if let Some(hash) = self.hash() {
            self.flights.update(hash, Phase::Claiming, None, |flight| {
                flight.state().phase != Phase::Claiming
            });
        }
    }

    /// Ends the flight with the stored COMPLETED record `landed` builds (built only when some call
    /// follows: a call alone pays nothing for it).
    pub(crate) fn land(&self, landed: impl FnOnce() -> Landed) {
        let hash = self.hash.swap(0, Ordering::Relaxed);
        if hash == 0 {
            return;
        }
        let Some(flight) = self.flights.end(hash) else {
            return;
        };
        // Out of the map: no one follows from now on, so the count only falls; this call holds one.
        let followed = Arc::strong_count(&flight) > 1;
        flight.set(Phase::Landed, None, followed.then(|| Arc::new(landed())));
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        hand_over(self.flights, *self.hash.get_mut());
    }
}

/// Ends the flight of the key hashed to `hash` (0: none, it landed or moved) without a stored
/// record: its followers join again.
fn hand_over(flights: &Flights, hash: u64) {
    if hash == 0 {
        return;
    }
    if let Some(flight) = flights.end(hash) {
        flight.set(Phase::Vacant, None, None);
    }
}

/// A lead a detached body's task holds ([`Lead::into_owned`]): dropped before its task takes it up
/// (the task never ran), it hands the flight over like a lead.
#[derive(Debug)]
pub(crate) struct OwnedLead {
    flights: Arc<Flights>,
    /// The key's hash; 0 once taken up by the task ([`OwnedLead::lead`]).
    hash: u64,
}

impl OwnedLead {
    /// The lead, borrowed from this hold for as long as the task runs.
    pub(crate) fn lead(&mut self) -> Lead<'_> {
        Lead {
            flights: &self.flights,
            hash: AtomicU64::new(std::mem::take(&mut self.hash)),
        }
    }
}

impl Drop for OwnedLead {
    fn drop(&mut self) {
        hand_over(&self.flights, self.hash);
    }
}

/// How following a flight ended.
#[derive(Debug)]
pub(crate) enum Followed {
    /// The leader passed on this stored record.
    Landed(Arc<Landed>),
    /// The key is held (or the follower's wait ran out while it was): `InProgress`, with when the claim
    /// holding it may be taken over (`None`: the leader's claim has not been answered yet).
    InProgress(Option<Busy>),
    /// The flight ended without a stored record: join again.
    Rejoin,
}

/// Follows `flight` until it lands, ends without a record, or (for a follower that may wait until
/// `wait_until`) the wait runs out; a follower without one waits only for the leader's claim's answer.
pub(crate) async fn follow_flight(flight: Arc<Flight>, wait_until: Option<Instant>) -> Followed {
    loop {
        // Registered before the state is read, so that no change between the two is missed.
        let changed = flight.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (phase, busy, landed) = {
            let state = flight.state();
            (state.phase, state.busy, state.landed.clone())
        };
        match follow(phase, wait_until.is_some()) {
            Follow::Take => return landed.map_or(Followed::Rejoin, Followed::Landed),
            Follow::Rejoin => return Followed::Rejoin,
            Follow::InProgress => return Followed::InProgress(busy),
            Follow::Wait => {}
        }
        match wait_until {
            Some(deadline) => {
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    return Followed::InProgress(busy);
                }
            }
            None => changed.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn landed() -> Landed {
        Landed {
            response: Some(Arc::from(&b"1"[..])),
            fingerprint: None,
        }
    }

    #[test]
    fn a_follower_waits_for_a_claims_answer_and_only_a_waiting_one_for_the_result() {
        assert_eq!(follow(Phase::Claiming, false), Follow::Wait);
        assert_eq!(follow(Phase::Claiming, true), Follow::Wait);
        assert_eq!(follow(Phase::Busy, false), Follow::InProgress);
        assert_eq!(follow(Phase::Busy, true), Follow::Wait);
        assert_eq!(follow(Phase::Landed, false), Follow::Take);
        assert_eq!(follow(Phase::Vacant, true), Follow::Rejoin);
        assert_eq!(join(None), Join::Lead);
        assert_eq!(join(Some(true)), Join::Follow);
        assert_eq!(join(Some(false)), Join::Alone);
    }

    #[tokio::test]
    async fn a_flight_is_led_once_followed_by_the_same_payload_and_ended_by_its_lead() {
        let flights = Flights::default();
        let Joined::Lead(lead) = flights.join("k", Some("p")) else {
            panic!("the first call leads")
        };
        assert!(matches!(flights.join("k", Some("q")), Joined::Alone));
        let Joined::Follow(flight) = flights.join("k", Some("p")) else {
            panic!("the same payload follows")
        };
        let follower = tokio::spawn(follow_flight(flight, None));
        let busy = Busy {
            until_ms: 31_000,
            own: true,
        };
        lead.busy(busy);
        // A follower without `wait` answers as soon as the key is held.
        assert!(matches!(
            follower.await.unwrap(),
            Followed::InProgress(Some(b)) if b == busy
        ));
        let Joined::Follow(flight) = flights.join("k", Some("p")) else {
            panic!("still in flight")
        };
        let waiting = tokio::spawn(follow_flight(
            flight,
            Some(Instant::now() + Duration::from_mins(1)),
        ));
        tokio::task::yield_now().await;
        lead.land(landed);
        let Followed::Landed(landed) = waiting.await.unwrap() else {
            panic!("the landed record")
        };
        assert_eq!(landed.response.as_deref(), Some(&b"1"[..]));
        drop(lead);
        // Ended: the next call leads a new flight.
        assert!(matches!(flights.join("k", None), Joined::Lead(_)));
        assert!(flights.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }

    #[tokio::test]
    async fn a_call_no_one_follows_allocates_no_flight_and_a_late_follower_sees_its_claim() {
        let flights = Flights::default();
        let hash = flights.hash("k");
        let Joined::Lead(lead) = flights.join("k", None) else {
            panic!("the first call leads")
        };
        let busy = Busy {
            until_ms: 31_000,
            own: true,
        };
        lead.busy(busy);
        assert!(
            flights.shard(hash)[&hash].flight.is_none(),
            "no flight until a call follows"
        );
        // A call that joins after the claim was answered learns it from the map's entry.
        let Joined::Follow(flight) = flights.join("k", None) else {
            panic!("the same payload follows")
        };
        assert!(matches!(
            follow_flight(flight, None).await,
            Followed::InProgress(Some(b)) if b == busy
        ));
        // Another key under the same hash (a collision, written in by hand) is never followed.
        let key = std::mem::replace(
            &mut flights.shard(hash).get_mut(&hash).unwrap().key,
            "j".into(),
        );
        assert!(matches!(flights.join("k", None), Joined::Alone));
        flights.shard(hash).get_mut(&hash).unwrap().key = key;
        lead.land(landed);
        drop(lead);
        assert!(flights.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }

    #[tokio::test]
    async fn a_lead_dropped_without_landing_hands_over_to_one_follower_at_a_time() {
        let flights = Flights::default();
        let Joined::Lead(lead) = flights.join("k", None) else {
            panic!("the first call leads")
        };
        let followers: Vec<_> = (0..3)
            .map(|_| match flights.join("k", None) {
                Joined::Follow(flight) => flight,
                other => panic!("{other:?}"),
            })
            .collect();
        drop(lead);
        let mut leads = Vec::new();
        for flight in followers {
            assert!(matches!(
                follow_flight(flight, Some(Instant::now())).await,
                Followed::Rejoin
            ));
            match flights.join("k", None) {
                Joined::Lead(lead) => leads.push(lead),
                Joined::Follow(_) => {}
                Joined::Alone => panic!("same payload"),
            }
        }
        assert_eq!(leads.len(), 1, "one follower leads, the others follow it");
        // Landing with no one following builds nothing, and ends the flight.
        leads[0].land(|| unreachable!("no follower"));
        drop(leads);
        assert!(flights.shards.iter().all(|s| s.lock().unwrap().is_empty()));
    }
}
