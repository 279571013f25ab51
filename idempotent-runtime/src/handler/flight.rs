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
//! The map is sharded by the key's hash, each shard a short-held lock: a call that finds no flight
//! pays one insertion when it starts and one removal when it ends (see `docs/performance-notes.md`).

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{BuildHasher, Hash, Hasher};
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

/// One key in flight.
#[derive(Debug)]
pub(crate) struct Flight {
    key: Box<str>,
    /// A hash of the leader's payload fingerprint (0 without one): whom it may lead. A collision only
    /// lets a call with another payload follow, and a follower still checks the landed record's own
    /// fingerprint.
    payload: u64,
    state: Mutex<State>,
    changed: Notify,
}

impl Flight {
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

/// The map's entry: a flight, found by its key.
#[derive(Debug)]
struct Entry(Arc<Flight>);

impl Borrow<str> for Entry {
    fn borrow(&self) -> &str {
        &self.0.key
    }
}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key.hash(state);
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for Entry {}

type Shard = Mutex<HashSet<Entry, foldhash::fast::RandomState>>;

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
    /// It goes alone (its payload differs from the leader's).
    Alone,
}

impl Flights {
    fn shard(&self, key: &str) -> MutexGuard<'_, HashSet<Entry, foldhash::fast::RandomState>> {
        let index = usize::try_from(self.hasher.hash_one(key) % SHARDS as u64).unwrap_or(0);
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins `key`'s flight as a call with `fingerprint`: leads a new one, follows the one in flight,
    /// or goes alone ([`join`]).
    pub(crate) fn join(&self, key: &str, fingerprint: Option<&str>) -> Joined<'_> {
        let payload = fingerprint.map_or(0, |f| self.hasher.hash_one(f));
        let mut shard = self.shard(key);
        let existing = shard.get(key).map(|entry| &entry.0);
        match join(existing.map(|flight| flight.payload == payload)) {
            Join::Follow => Joined::Follow(Arc::clone(existing.expect("a flight to follow"))),
            Join::Alone => Joined::Alone,
            Join::Lead => {
                let flight = Arc::new(Flight {
                    key: key.into(),
                    payload,
                    state: Mutex::new(State {
                        phase: Phase::Claiming,
                        busy: None,
                        landed: None,
                    }),
                    changed: Notify::new(),
                });
                shard.insert(Entry(Arc::clone(&flight)));
                Joined::Lead(Lead {
                    flights: self,
                    flight: Some(flight),
                })
            }
        }
    }

    /// Takes `flight` out of the map (if it is still the key's): no call joins it from now on.
    fn end(&self, flight: &Arc<Flight>) {
        let mut shard = self.shard(&flight.key);
        if shard
            .get(&*flight.key)
            .is_some_and(|entry| Arc::ptr_eq(&entry.0, flight))
        {
            shard.remove(&*flight.key);
        }
    }
}

/// The leader's hold on its flight. Dropped without having [`land`](Lead::land)ed (the call ended
/// without a stored COMPLETED record, its future was dropped, it panicked), it hands the flight over.
#[derive(Debug)]
pub(crate) struct Lead<'a> {
    flights: &'a Flights,
    /// `None` once moved into an owned hold ([`Lead::into_owned`]).
    flight: Option<Arc<Flight>>,
}

impl Lead<'_> {
    /// This hold, owned, for a detached body's task (`flights` is the map it was taken from, shared):
    /// the flight goes on while the body runs, whether or not its caller still waits.
    pub(crate) fn into_owned(mut self, flights: &Arc<Flights>) -> OwnedLead {
        OwnedLead {
            flights: Arc::clone(flights),
            flight: self.flight.take(),
        }
    }

    /// The key is held (by the leader's own claim, or by another process's it waits on) until `busy`
    /// says. Followers without `wait` answer `InProgress`.
    pub(crate) fn busy(&self, busy: Busy) {
        if let Some(flight) = &self.flight {
            flight.set(Phase::Busy, Some(busy), None);
        }
    }

    /// The leader's claim is on its way again (it re-claims a key it found claimable).
    pub(crate) fn claiming(&self) {
        if let Some(flight) = &self.flight
            && flight.state().phase != Phase::Claiming
        {
            flight.set(Phase::Claiming, None, None);
        }
    }

    /// Ends the flight with the stored COMPLETED record `landed` builds (built only when some call
    /// follows: a call alone pays nothing for it).
    pub(crate) fn land(&self, landed: impl FnOnce() -> Landed) {
        let Some(flight) = &self.flight else { return };
        self.flights.end(flight);
        // Out of the map: no one follows from now on, so the count only falls; this lead holds one.
        let followed = Arc::strong_count(flight) > 1;
        flight.set(Phase::Landed, None, followed.then(|| Arc::new(landed())));
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if let Some(flight) = self.flight.take() {
            hand_over(self.flights, &flight);
        }
    }
}

/// Ends `flight` without a stored record, unless it landed: its followers join again.
fn hand_over(flights: &Flights, flight: &Arc<Flight>) {
    if flight.state().phase == Phase::Landed {
        return;
    }
    flights.end(flight);
    flight.set(Phase::Vacant, None, None);
}

/// A lead a detached body's task holds ([`Lead::into_owned`]): dropped before its task takes it up
/// (the task never ran), it hands the flight over like a lead.
#[derive(Debug)]
pub(crate) struct OwnedLead {
    flights: Arc<Flights>,
    flight: Option<Arc<Flight>>,
}

impl OwnedLead {
    /// The lead, borrowed from this hold for as long as the task runs.
    pub(crate) fn lead(&mut self) -> Lead<'_> {
        Lead {
            flights: &self.flights,
            flight: self.flight.take(),
        }
    }
}

impl Drop for OwnedLead {
    fn drop(&mut self) {
        if let Some(flight) = self.flight.take() {
            hand_over(&self.flights, &flight);
        }
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
