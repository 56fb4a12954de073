//! CodingSets (seed 000 §5.1): every node belongs to one extended group of `width + l` nodes;
//! a new range goes to one group and takes its `width` least-loaded members. Few groups means
//! few copysets (sets of r+1 nodes whose joint failure loses a range), so a correlated failure
//! of f% of the nodes loses data far less often than with random placement, while the `l`
//! spare members of a group absorb load imbalance inside it.
//!
//! Membership rule (what "moves as little as possible" means here). A node's *assignment* is
//! the group it belongs to, or the spare pool. Only assignments drive placement, so a node
//! *moves* when its assignment changes; a move makes the ranges it already holds straddle two
//! groups, which is what adds copysets. The rule:
//! - **Groups** hold between `width` and `width + l` members, pairwise disjoint, formed with one
//!   node per failure domain while the pool has enough domains (largest domains first).
//! - **Spares** hold no new ranges. There are fewer than `width` of them, and never while a
//!   group is short (below `width + l`).
//! - **A node joins**: it fills the shortest short group (preferring a group without its domain),
//!   else it waits as a spare; when the spares reach `width + l` they form a new group, and at
//!   `width` they form a short group. Nobody else moves.
//! - **A node leaves**: a spare (one with a new domain for the group first) takes its place. With
//!   no spare the group shrinks; below `width` it can take no range and dissolves, its members
//!   become spares and refill other short groups or form a group.
//! - So after one join only the joiner and spares move; after one leave only spares and members
//!   of the leaver's group move. Other groups only gain members, never lose them.
//!
//! Membership is learnt from the candidates of [`Placement::place`]: a node index not seen
//! before joins, a known one missing from the slice leaves. `place` re-reads membership when the
//! slice's length changes or a member is not where it was; callers that swap nodes at equal
//! length call [`CodingSets::update_membership`].

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use rand::seq::SliceRandom;
use rand::Rng;

use crate::{domain_key, take_spread, DomainKey, NodeLoad, Placed, Placement, PlacementError};

/// Rejection attempts when sampling a group before listing every eligible group.
const GROUP_ATTEMPTS: usize = 32;

/// How CodingSets picks the extended group of a new range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupChoice {
    /// Uniformly at random (the seed). Most of CodingSets' load imbalance comes from this.
    Random,
    /// Two random groups, the one with the lower mean member load (ties at random). O(1) groups
    /// looked at per range, and no herding when many clients place from similar snapshots.
    PowerOfTwo,
    /// The group with the lowest mean member load (ties at random). Looks at every node per
    /// range; the best balance from a fresh snapshot, but clients placing at once from the
    /// same snapshot would all pick the same group.
    LeastLoaded,
}

/// What one membership update did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipChange {
    /// Node indices seen for the first time.
    pub joined: Vec<usize>,
    /// Known node indices missing from the candidates.
    pub left: Vec<usize>,
    /// Nodes present before and after whose assignment (group or spare) changed.
    pub moved: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Group(usize),
    Spare,
}

struct Membership {
    width: usize,
    group_size: usize,
    /// Indexed by group id; an empty group is a retired id, reused by the next new group.
    groups: Vec<Vec<usize>>,
    /// Ids of groups with at least `width` members: the ones that take ranges.
    active: Vec<usize>,
    spares: Vec<usize>,
    slot: HashMap<usize, Slot>,
    /// Where each node was in the candidates of the last update.
    position: HashMap<usize, usize>,
}

/// The CodingSets policy. See the module documentation for the membership rule.
pub struct CodingSets<R: Rng + Send> {
    rng: R,
    load_balancing_factor: usize,
    group_choice: GroupChoice,
    membership: Option<Membership>,
}

impl<R: Rng + Send> CodingSets<R> {
    /// `load_balancing_factor` is the seed's l: extended groups have `width + l` nodes. Groups
    /// are formed at the first `place` (or `update_membership`) for that call's width.
    pub fn new(rng: R, load_balancing_factor: usize, group_choice: GroupChoice) -> Self {
        CodingSets { rng, load_balancing_factor, group_choice, membership: None }
    }

    /// Live groups as (group id, members). Ids are stable across membership changes.
    pub fn groups(&self) -> impl Iterator<Item = (usize, &[usize])> {
        self.membership
            .iter()
            .flat_map(|m| m.groups.iter().enumerate())
            .filter(|(_, members)| !members.is_empty())
            .map(|(id, members)| (id, members.as_slice()))
    }

    /// Nodes waiting in the spare pool.
    pub fn spares(&self) -> &[usize] {
        self.membership.as_ref().map(|m| m.spares.as_slice()).unwrap_or(&[])
    }

    /// Node index -> group id (`None` for a spare), for every known node.
    pub fn assignment(&self) -> BTreeMap<usize, Option<usize>> {
        let mut map = BTreeMap::new();
        if let Some(m) = &self.membership {
            for (&node, &slot) in &m.slot {
                map.insert(node, if let Slot::Group(id) = slot { Some(id) } else { None });
            }
        }
        map
    }

    /// Brings membership in line with `candidates` (forming the groups on the first call):
    /// unknown node indices join, known ones missing from `candidates` leave, by the rule of
    /// the module documentation. Errors when the groups were formed for another width.
    pub fn update_membership(
        &mut self,
        candidates: &[NodeLoad],
        width: usize,
    ) -> Result<MembershipChange, PlacementError> {
        assert!(width > 0, "a range has at least one split");
        let membership = self.membership.get_or_insert_with(|| Membership {
            width,
            group_size: width + self.load_balancing_factor,
            groups: Vec::new(),
            active: Vec::new(),
            spares: Vec::new(),
            slot: HashMap::new(),
            position: HashMap::new(),
        });
        if membership.width != width {
            return Err(PlacementError::WidthChanged { formed_for: membership.width, asked: width });
        }
        Ok(membership.update(candidates))
    }

    /// The node behind `member`, found by position; `None` when the candidates moved it.
    fn lookup<'a>(
        membership: &Membership,
        candidates: &'a [NodeLoad],
        member: usize,
    ) -> Option<&'a NodeLoad> {
        if let Some(node) = candidates.get(member).filter(|n| n.node_index == member) {
            return Some(node);
        }
        let position = *membership.position.get(&member)?;
        candidates.get(position).filter(|n| n.node_index == member)
    }

    /// (usable members, load sum, member count) of a group, or `None` when a member is missing.
    fn group_state(
        membership: &Membership,
        candidates: &[NodeLoad],
        group: usize,
    ) -> Option<(usize, u128, usize)> {
        let members = &membership.groups[group];
        let mut usable = 0;
        let mut load: u128 = 0;
        for &member in members {
            let node = Self::lookup(membership, candidates, member)?;
            usable += usize::from(node.slabs_free > 0);
            load += u128::from(node.slabs_mapped);
        }
        Some((usable, load, members.len()))
    }

    /// Picks a group for the next range; `Ok(None)` means the membership is stale.
    fn choose_group(&mut self, candidates: &[NodeLoad]) -> Result<Option<usize>, PlacementError> {
        let membership = self.membership.as_ref().expect("formed before choosing");
        let width = membership.width;
        let active = &membership.active;
        let state = |group| Self::group_state(membership, candidates, group);
        // Sampling first keeps a call O(group size) on large clusters.
        let sampled = match self.group_choice {
            GroupChoice::Random if !active.is_empty() => {
                let mut found = None;
                for _ in 0..GROUP_ATTEMPTS {
                    let group = active[self.rng.gen_range(0..active.len())];
                    let Some((usable, _, _)) = state(group) else { return Ok(None) };
                    if usable >= width {
                        found = Some(group);
                        break;
                    }
                }
                found
            }
            GroupChoice::PowerOfTwo if active.len() >= 2 => {
                let mut found = None;
                for _ in 0..GROUP_ATTEMPTS {
                    let mut two = active.choose_multiple(&mut self.rng, 2);
                    let (a, b) = (*two.next().expect("two active"), *two.next().expect("two active"));
                    let (Some(state_a), Some(state_b)) = (state(a), state(b)) else { return Ok(None) };
                    if state_a.0 >= width && state_b.0 >= width {
                        found = Some(lighter(&mut self.rng, (a, state_a), (b, state_b)));
                        break;
                    }
                }
                found
            }
            _ => None,
        };
        if sampled.is_some() {
            return Ok(sampled);
        }
        // Exact path: every active group.
        let mut eligible = Vec::new();
        let mut best_usable = 0;
        for &group in active {
            let Some(group_state) = state(group) else { return Ok(None) };
            best_usable = best_usable.max(group_state.0);
            if group_state.0 >= width {
                eligible.push((group, group_state));
            }
        }
        if eligible.is_empty() {
            return Err(PlacementError::NotEnoughNodes { width, available: best_usable });
        }
        let chosen = match self.group_choice {
            GroupChoice::Random => eligible.choose(&mut self.rng).expect("non-empty").0,
            GroupChoice::PowerOfTwo if eligible.len() == 1 => eligible[0].0,
            GroupChoice::PowerOfTwo => {
                let mut two = eligible.choose_multiple(&mut self.rng, 2);
                let (a, b) = (*two.next().expect("two eligible"), *two.next().expect("two eligible"));
                lighter(&mut self.rng, a, b)
            }
            GroupChoice::LeastLoaded => {
                let mut best = eligible[0];
                let mut ties = 1;
                for &entry in &eligible[1..] {
                    match compare_load(entry.1, best.1) {
                        Ordering::Less => {
                            best = entry;
                            ties = 1;
                        }
                        // Reservoir sampling: each of the tied groups wins with equal chance.
                        Ordering::Equal => {
                            ties += 1;
                            if self.rng.gen_range(0..ties) == 0 {
                                best = entry;
                            }
                        }
                        Ordering::Greater => {}
                    }
                }
                best.0
            }
        };
        Ok(Some(chosen))
    }
}

/// Compares mean member loads `load_a / len_a` and `load_b / len_b` exactly.
fn compare_load(a: (usize, u128, usize), b: (usize, u128, usize)) -> Ordering {
    (a.1 * b.2 as u128).cmp(&(b.1 * a.2 as u128))
}

fn lighter<R: Rng>(rng: &mut R, a: (usize, (usize, u128, usize)), b: (usize, (usize, u128, usize))) -> usize {
    match compare_load(a.1, b.1) {
        Ordering::Less => a.0,
        Ordering::Greater => b.0,
        Ordering::Equal => {
            if rng.gen_bool(0.5) {
                a.0
            } else {
                b.0
            }
        }
    }
}

impl<R: Rng + Send> Placement for CodingSets<R> {
    /// Errors: `NotEnoughNodes` when no group has `width` members with a free slab
    /// (`available` is the best group's count); `WidthChanged` when the groups were formed for
    /// another width.
    fn place(&mut self, candidates: &[NodeLoad], width: usize) -> Result<Placed, PlacementError> {
        let stale = match &self.membership {
            None => true,
            Some(m) => m.position.len() != candidates.len(),
        };
        if stale {
            self.update_membership(candidates, width)?;
        }
        let formed_for = self.membership.as_ref().expect("formed above").width;
        if formed_for != width {
            return Err(PlacementError::WidthChanged { formed_for, asked: width });
        }
        let group = match self.choose_group(candidates)? {
            Some(group) => group,
            None => {
                self.update_membership(candidates, width)?;
                self.choose_group(candidates)?.expect("membership was just read from these candidates")
            }
        };
        let membership = self.membership.as_ref().expect("formed above");
        let mut usable: Vec<&NodeLoad> = membership.groups[group]
            .iter()
            .map(|&member| Self::lookup(membership, candidates, member).expect("checked by choose_group"))
            .filter(|node| node.slabs_free > 0)
            .collect();
        // Shuffle first so that the stable sort leaves equal loads in random order.
        usable.shuffle(&mut self.rng);
        usable.sort_by_key(|node| node.slabs_mapped);
        Ok(take_spread(&usable, width))
    }

    /// Keeps the range in its extended group: the membership is brought up to date first (the
    /// lost node leaves and a spare may take its place in the group), then the least-loaded
    /// group member outside the range is chosen, in a failure domain the range does not use yet.
    /// The group is the one most of the range's live nodes belong to. When no member is in a new
    /// domain (spares and returning nodes joined the group from racks it already uses), the range
    /// leaves the group for a node in a new domain, and the copysets grow by one range; only
    /// when no node anywhere is in a new domain does a member in a used one take it.
    fn replace(&mut self, candidates: &[NodeLoad], current: &[usize]) -> Result<usize, PlacementError> {
        let group = self.membership.as_ref().map(|m| m.width).and_then(|width| {
            self.update_membership(candidates, width).ok()?;
            let membership = self.membership.as_ref()?;
            let mut votes: BTreeMap<usize, usize> = BTreeMap::new();
            for node in current {
                if let Some(Slot::Group(id)) = membership.slot.get(node) {
                    *votes.entry(*id).or_insert(0) += 1;
                }
            }
            votes.into_iter().max_by_key(|&(id, count)| (count, Reverse(id))).map(|(id, _)| id)
        });
        let Some(group) = group else {
            return crate::least_loaded_outside(candidates, current, |_| true);
        };
        let members = &self.membership.as_ref().expect("a group implies membership").groups[group];
        let in_group = |node: usize| members.contains(&node);
        // A member in a failure domain the range does not use yet; else a node in such a domain
        // outside the group (the copysets grow by one range, which costs far less than a range
        // whose splits pile into one rack: losing the rack would lose it); else any member.
        crate::least_loaded_in_new_domain(candidates, current, in_group)
            .or_else(|_| crate::least_loaded_in_new_domain(candidates, current, |_| true))
            .or_else(|_| crate::least_loaded_outside(candidates, current, in_group))
            .or_else(|_| crate::least_loaded_outside(candidates, current, |_| true))
    }
}

impl Membership {
    fn update(&mut self, candidates: &[NodeLoad]) -> MembershipChange {
        let before: HashMap<usize, Slot> = self.slot.clone();
        let lookup: HashMap<usize, &NodeLoad> = candidates.iter().map(|n| (n.node_index, n)).collect();
        self.position = candidates.iter().enumerate().map(|(position, n)| (n.node_index, position)).collect();
        let mut change = MembershipChange::default();

        // Leaves first, in group then spare order so that the result does not depend on hashing.
        let mut left: Vec<usize> =
            self.groups.iter().flatten().copied().filter(|n| !lookup.contains_key(n)).collect();
        left.extend(self.spares.iter().copied().filter(|n| !lookup.contains_key(n)));
        for &node in &left {
            match self.slot.remove(&node).expect("a known node has a slot") {
                Slot::Spare => self.spares.retain(|&s| s != node),
                Slot::Group(id) => self.groups[id].retain(|&m| m != node),
            }
        }
        change.left = left;
        // Joins in candidate order.
        let mut seen = HashSet::new();
        for node in candidates {
            assert!(seen.insert(node.node_index), "candidates list node {} twice", node.node_index);
            if let std::collections::hash_map::Entry::Vacant(entry) = self.slot.entry(node.node_index) {
                entry.insert(Slot::Spare);
                self.spares.push(node.node_index);
                change.joined.push(node.node_index);
            }
        }
        self.settle(&lookup);

        let mut moved: Vec<usize> = before
            .iter()
            .filter(|(node, slot)| self.slot.get(node).is_some_and(|now| now != *slot))
            .map(|(&node, _)| node)
            .collect();
        moved.sort_unstable();
        change.moved = moved;
        self.active = (0..self.groups.len()).filter(|&id| self.groups[id].len() >= self.width).collect();
        change
    }

    /// Restores the invariants: spares fill short groups, groups below `width` dissolve,
    /// leftover spares form groups.
    fn settle(&mut self, lookup: &HashMap<usize, &NodeLoad>) {
        loop {
            self.fill_short_groups(lookup);
            let below: Vec<usize> = (0..self.groups.len())
                .filter(|&id| !self.groups[id].is_empty() && self.groups[id].len() < self.width)
                .collect();
            if below.is_empty() {
                break;
            }
            for id in below {
                for node in std::mem::take(&mut self.groups[id]) {
                    self.slot.insert(node, Slot::Spare);
                    self.spares.push(node);
                }
            }
        }
        self.form_groups(lookup);
        debug_assert!(self.spares.len() < self.width);
    }

    /// While a group is short and spares wait, the shortest group (lowest id on ties) takes the
    /// first spare whose domain it lacks, else the first spare.
    fn fill_short_groups(&mut self, lookup: &HashMap<usize, &NodeLoad>) {
        while !self.spares.is_empty() {
            let shortest = (0..self.groups.len())
                .filter(|&id| !self.groups[id].is_empty() && self.groups[id].len() < self.group_size)
                .min_by_key(|&id| (self.groups[id].len(), id));
            let Some(id) = shortest else { break };
            let domains: HashSet<DomainKey<'_>> =
                self.groups[id].iter().map(|m| domain_key(lookup[m])).collect();
            let pick =
                self.spares.iter().position(|s| !domains.contains(&domain_key(lookup[s]))).unwrap_or(0);
            let node = self.spares.remove(pick);
            self.groups[id].push(node);
            self.slot.insert(node, Slot::Group(id));
        }
    }

    /// Forms groups from the spares: full ones while at least `group_size` wait, then a short one
    /// if at least `width` remain. Each group takes one node per domain while domains last,
    /// largest domains first: taking from the largest keeps enough distinct domains for the
    /// groups still to form. One pass with a heap, so forming a million-node cluster is fast.
    fn form_groups(&mut self, lookup: &HashMap<usize, &NodeLoad>) {
        if self.spares.len() < self.width {
            return;
        }
        // Domain buckets in first-appearance order; each bucket a queue of spares.
        let mut bucket_of: HashMap<DomainKey<'_>, usize> = HashMap::new();
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        for &spare in &self.spares {
            let next = buckets.len();
            let bucket = *bucket_of.entry(domain_key(lookup[&spare])).or_insert(next);
            if bucket == next {
                buckets.push(Vec::new());
            }
            buckets[bucket].push(spare);
        }
        // Max-heap on (remaining, earliest bucket).
        let mut heap: BinaryHeap<(usize, Reverse<usize>)> =
            buckets.iter().enumerate().map(|(b, nodes)| (nodes.len(), Reverse(b))).collect();
        let mut taken_from = vec![0usize; buckets.len()];
        let mut remaining = self.spares.len();
        let mut taken: HashSet<usize> = HashSet::new();
        // Retired ids are reused, lowest first.
        let mut free_ids: Vec<usize> =
            (0..self.groups.len()).rev().filter(|&id| self.groups[id].is_empty()).collect();
        while remaining >= self.width {
            let size = remaining.min(self.group_size);
            let mut members = Vec::with_capacity(size);
            while members.len() < size {
                // One round: one node from each of the largest domains.
                let mut popped = Vec::new();
                while members.len() < size {
                    let Some((left, Reverse(bucket))) = heap.pop() else { break };
                    members.push(buckets[bucket][taken_from[bucket]]);
                    taken_from[bucket] += 1;
                    if left > 1 {
                        popped.push((left - 1, Reverse(bucket)));
                    }
                }
                heap.extend(popped);
            }
            remaining -= size;
            let id = match free_ids.pop() {
                Some(id) => id,
                None => {
                    self.groups.push(Vec::new());
                    self.groups.len() - 1
                }
            };
            for &node in &members {
                self.slot.insert(node, Slot::Group(id));
                taken.insert(node);
            }
            self.groups[id] = members;
        }
        self.spares.retain(|s| !taken.contains(s));
    }
}

#[cfg(test)]
mod tests;
