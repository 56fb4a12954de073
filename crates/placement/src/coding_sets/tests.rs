use super::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn node(index: usize, domain: &str) -> NodeLoad {
    NodeLoad { node_index: index, failure_domain: domain.to_string(), slabs_mapped: 0, slabs_free: 100 }
}

/// `count` nodes, each its own domain (empty label).
fn lone_nodes(count: usize) -> Vec<NodeLoad> {
    (0..count).map(|i| node(i, "")).collect()
}

fn policy(l: usize, choice: GroupChoice) -> CodingSets<StdRng> {
    CodingSets::new(StdRng::seed_from_u64(7), l, choice)
}

/// Checks the membership invariants of the module documentation against `candidates`.
fn check_invariants(policy: &CodingSets<StdRng>, candidates: &[NodeLoad], width: usize, group_size: usize) {
    let mut seen = HashSet::new();
    let mut short_groups = 0;
    for (_, members) in policy.groups() {
        assert!(members.len() >= width && members.len() <= group_size, "group of {}", members.len());
        short_groups += usize::from(members.len() < group_size);
        for &m in members {
            assert!(seen.insert(m), "node {m} in two places");
        }
    }
    for &s in policy.spares() {
        assert!(seen.insert(s), "spare {s} also in a group");
    }
    assert!(policy.spares().len() < width, "{} spares", policy.spares().len());
    assert!(short_groups == 0 || policy.spares().is_empty(), "short group beside spares");
    let all: HashSet<usize> = candidates.iter().map(|n| n.node_index).collect();
    assert_eq!(seen, all, "every node is in exactly one group or spare");
}

#[test]
fn thousand_nodes_form_83_groups_of_12_and_4_spares() {
    let candidates = lone_nodes(1000);
    let mut policy = policy(2, GroupChoice::Random);
    policy.update_membership(&candidates, 10).unwrap();
    assert_eq!(policy.groups().count(), 83);
    assert!(policy.groups().all(|(_, m)| m.len() == 12));
    assert_eq!(policy.spares().len(), 4);
    check_invariants(&policy, &candidates, 10, 12);
}

#[test]
fn a_range_takes_the_least_loaded_members_of_one_group() {
    let mut candidates = lone_nodes(24);
    for n in &mut candidates {
        n.slabs_mapped = (n.node_index as u64 * 5) % 7;
    }
    let mut policy = policy(2, GroupChoice::Random);
    for _ in 0..20 {
        let placed = policy.place(&candidates, 10).unwrap();
        let (_, members) = policy.groups().find(|(_, m)| m.contains(&placed.nodes[0])).unwrap();
        assert!(placed.nodes.iter().all(|n| members.contains(n)), "one group per range");
        let chosen_max = placed.nodes.iter().map(|&n| candidates[n].slabs_mapped).max().unwrap();
        let left_out_min =
            members.iter().filter(|m| !placed.nodes.contains(m)).map(|&m| candidates[m].slabs_mapped).min();
        assert!(left_out_min.is_none_or(|min| min >= chosen_max), "least-loaded members first");
        assert!(placed.distinct_domains);
        for &n in &placed.nodes {
            candidates[n].slabs_mapped += 1;
        }
    }
}

#[test]
fn small_cluster_is_one_short_group() {
    // 10 nodes, EC(8,2), l=2: fewer than 12, so one group of 10 (l shrinks to 0).
    let candidates = lone_nodes(10);
    let mut policy = policy(2, GroupChoice::PowerOfTwo);
    let placed = policy.place(&candidates, 10).unwrap();
    assert_eq!(placed.nodes.len(), 10);
    assert_eq!(policy.groups().count(), 1);
    let error = policy.place(&lone_nodes(10), 8).unwrap_err();
    assert_eq!(error, PlacementError::WidthChanged { formed_for: 10, asked: 8 });
}

#[test]
fn a_rebuilt_slab_stays_in_the_group_of_its_range() {
    let mut candidates = lone_nodes(24); // 2 groups of 12 (k+r=10, l=2)
    let mut policy = policy(2, GroupChoice::Random);
    let placed = policy.place(&candidates, 10).unwrap();
    let (_, members) = policy.groups().find(|(_, m)| m.contains(&placed.nodes[0])).unwrap();
    let members = members.to_vec();
    // The node of split 4 dies: it leaves the candidates, and the rebuild goes to one of
    // the two group members the range does not use, never to the other group.
    let dead = placed.nodes[4];
    candidates.retain(|n| n.node_index != dead);
    let spare_members: Vec<usize> = members.iter().copied().filter(|m| !placed.nodes.contains(m)).collect();
    let chosen = policy.replace(&candidates, &placed.nodes).unwrap();
    assert!(spare_members.contains(&chosen), "{chosen} not in {spare_members:?}");
    // With the group used up, the range leaves it rather than fail.
    let mut current = placed.nodes.clone();
    current.extend(&spare_members);
    let outside = policy.replace(&candidates, &current).unwrap();
    assert!(!members.contains(&outside));
}

/// Defect (issue 28's durability run): once a spare from a rack the range uses had joined the
/// group, a rebuild took it and put two splits of the range in one rack, so a rack failure lost
/// ranges that domain-aware placement had spread. A rebuilt slab now leaves the group instead.
#[test]
fn a_rebuilt_slab_leaves_its_group_rather_than_crowd_a_failure_domain() {
    let mut candidates: Vec<NodeLoad> = (0..24).map(|i| node(i, &format!("rack{i}"))).collect();
    let mut policy = policy(2, GroupChoice::Random);
    let placed = policy.place(&candidates, 10).unwrap();
    let (_, members) = policy.groups().find(|(_, m)| m.contains(&placed.nodes[0])).unwrap();
    let unused: Vec<usize> = members.iter().copied().filter(|m| !placed.nodes.contains(m)).collect();
    // A node in the rack of split 0 joins as a spare; the group's two members the range does
    // not use die, so the spare fills the group.
    let crowding_rack = candidates[placed.nodes[0]].failure_domain.clone();
    candidates.push(node(24, &crowding_rack));
    candidates.retain(|n| !unused.contains(&n.node_index));
    policy.update_membership(&candidates, 10).unwrap();
    assert!(policy.groups().any(|(_, m)| m.contains(&24) && m.contains(&placed.nodes[0])));
    // Split 4's node dies: the only member left to give is in split 0's rack.
    candidates.retain(|n| n.node_index != placed.nodes[4]);
    let chosen = policy.replace(&candidates, &placed.nodes).unwrap();
    assert_ne!(chosen, 24, "the rebuilt slab crowded {crowding_rack}");
    let chosen_rack = &candidates.iter().find(|n| n.node_index == chosen).unwrap().failure_domain;
    assert!(placed.nodes.iter().all(|&n| format!("rack{n}") != *chosen_rack), "{chosen_rack} is used");
}

#[test]
fn removed_node_is_replaced_by_a_spare_and_nothing_else_moves() {
    let mut candidates = lone_nodes(26); // 2 groups of 12, 2 spares (k+r=10, l=2)
    let mut policy = policy(2, GroupChoice::Random);
    policy.update_membership(&candidates, 10).unwrap();
    let spares_before = policy.spares().to_vec();
    let victim = policy.groups().next().unwrap().1[3];
    candidates.retain(|n| n.node_index != victim);
    let change = policy.update_membership(&candidates, 10).unwrap();
    assert_eq!(change.left, vec![victim]);
    assert_eq!(change.moved.len(), 1);
    assert!(spares_before.contains(&change.moved[0]));
    check_invariants(&policy, &candidates, 10, 12);
}

#[test]
fn group_below_width_dissolves_into_short_groups() {
    // 24 nodes, width 10, l=2: two groups of 12, no spares. Remove three from group A:
    // A falls to 9 < 10 and dissolves; its 9 members refill group B? B is full, so they
    // wait as spares... fewer than width would break the rule, so they form a short group.
    let mut candidates = lone_nodes(24);
    let mut policy = policy(2, GroupChoice::Random);
    policy.update_membership(&candidates, 10).unwrap();
    let (a, members_a) = policy.groups().next().map(|(id, m)| (id, m.to_vec())).unwrap();
    let mut moved_total = 0;
    for &victim in &members_a[..3] {
        candidates.retain(|n| n.node_index != victim);
        let change = policy.update_membership(&candidates, 10).unwrap();
        assert!(change.moved.iter().all(|m| members_a.contains(m)), "only the leaver's group moves");
        moved_total += change.moved.len();
        check_invariants(&policy, &candidates, 10, 12);
    }
    // A went 12 -> 11 -> 10 -> 9: dissolved, and its 9 members (below width) are spares.
    assert!(policy.groups().all(|(id, _)| id != a));
    assert_eq!(policy.spares().len(), 9);
    assert_eq!(moved_total, 9);
    // A new node fills... the spares reach width and form a short group.
    candidates.push(node(100, ""));
    let change = policy.update_membership(&candidates, 10).unwrap();
    assert_eq!(change.joined, vec![100]);
    assert_eq!(policy.groups().count(), 2);
    check_invariants(&policy, &candidates, 10, 12);
}

#[test]
fn joining_node_fills_a_short_group_first() {
    let mut candidates = lone_nodes(23); // one full group (12) + a short group of 11
    let mut policy = policy(2, GroupChoice::Random);
    policy.update_membership(&candidates, 10).unwrap();
    assert_eq!(policy.spares().len(), 0);
    candidates.push(node(23, ""));
    let change = policy.update_membership(&candidates, 10).unwrap();
    assert!(change.moved.is_empty());
    assert!(policy.groups().all(|(_, m)| m.len() == 12));
}

#[test]
fn groups_span_distinct_domains_when_domains_allow() {
    // 6 racks of 10 nodes, groups of 5: 12 groups, each rack can give one node to 10 of them.
    let candidates: Vec<NodeLoad> = (0..60).map(|i| node(i, &format!("rack{}", i % 6))).collect();
    let mut policy = policy(1, GroupChoice::Random);
    policy.update_membership(&candidates, 4).unwrap();
    for (_, members) in policy.groups() {
        let racks: HashSet<_> = members.iter().map(|&m| &candidates[m].failure_domain).collect();
        assert_eq!(racks.len(), members.len());
    }
}

#[test]
fn candidates_in_any_order_and_subset_indices() {
    // Node indices that are not positions (a caller passing a subset, shuffled).
    let mut candidates: Vec<NodeLoad> = (0..30).map(|i| node(1000 + 3 * i, "")).collect();
    candidates.reverse();
    let mut policy = policy(2, GroupChoice::LeastLoaded);
    for _ in 0..10 {
        let placed = policy.place(&candidates, 10).unwrap();
        let (_, members) = policy.groups().find(|(_, m)| m.contains(&placed.nodes[0])).unwrap();
        assert!(placed.nodes.iter().all(|n| members.contains(n)));
        for n in &mut candidates {
            if placed.nodes.contains(&n.node_index) {
                n.slabs_mapped += 1;
            }
        }
    }
}

#[test]
fn full_group_is_skipped() {
    let mut candidates = lone_nodes(24);
    let mut policy = policy(2, GroupChoice::Random);
    policy.update_membership(&candidates, 10).unwrap();
    let (_, full) = policy.groups().next().map(|(id, m)| (id, m.to_vec())).unwrap();
    for &m in &full[..3] {
        candidates[m].slabs_free = 0;
    }
    for _ in 0..20 {
        let placed = policy.place(&candidates, 10).unwrap();
        assert!(placed.nodes.iter().all(|n| !full.contains(n)));
    }
    for n in &mut candidates {
        n.slabs_free = u64::from(n.node_index % 2 == 0);
    }
    let error = policy.place(&candidates, 10).unwrap_err();
    assert_eq!(error, PlacementError::NotEnoughNodes { width: 10, available: 6 });
}

#[test]
fn least_loaded_group_choice_balances_groups() {
    let mut candidates = lone_nodes(120);
    let mut policy = policy(2, GroupChoice::LeastLoaded);
    for _ in 0..100 {
        let placed = policy.place(&candidates, 10).unwrap();
        for &n in &placed.nodes {
            candidates[n].slabs_mapped += 1;
        }
    }
    // 100 ranges over 10 groups: exactly 10 each, so every node holds 8 or 9 slabs.
    let loads: Vec<u64> = candidates.iter().map(|n| n.slabs_mapped).collect();
    assert!(loads.iter().all(|&l| (8..=9).contains(&l)), "{loads:?}");
}

proptest! {
    #[test]
    fn groups_are_domain_distinct_when_no_domain_exceeds_the_group_count(
        domain_sizes in proptest::collection::vec(1usize..8, 1..20),
        width in 2usize..6,
        l in 0usize..3,
    ) {
        let mut candidates = Vec::new();
        for (d, &size) in domain_sizes.iter().enumerate() {
            for _ in 0..size {
                let index = candidates.len();
                candidates.push(node(index, &format!("d{d}")));
            }
        }
        let group_size = width + l;
        let groups = candidates.len() / group_size;
        prop_assume!(groups > 0 && domain_sizes.iter().all(|&s| s <= groups));
        let mut policy = policy(l, GroupChoice::Random);
        policy.update_membership(&candidates, width).unwrap();
        check_invariants(&policy, &candidates, width, group_size);
        for (_, members) in policy.groups() {
            let domains: HashSet<_> = members.iter().map(|&m| &candidates[m].failure_domain).collect();
            prop_assert_eq!(domains.len(), members.len());
        }
    }

    #[test]
    fn membership_changes_move_only_the_groups_they_touch(
        initial in 0usize..60,
        operations in proptest::collection::vec((any::<bool>(), any::<prop::sample::Index>()), 1..40),
        width in 2usize..6,
        l in 0usize..4,
        domains in 1u8..6,
    ) {
        let group_size = width + l;
        let mut next_index = 0;
        let fresh = |next_index: &mut usize| {
            let index = *next_index;
            *next_index += 1;
            node(index, &format!("d{}", index as u8 % domains))
        };
        let mut candidates: Vec<NodeLoad> = (0..initial).map(|_| fresh(&mut next_index)).collect();
        let mut policy = policy(l, GroupChoice::Random);
        policy.update_membership(&candidates, width).unwrap();
        check_invariants(&policy, &candidates, width, group_size);
        for (join, pick) in operations {
            let before = policy.assignment();
            let spares_before: HashSet<usize> = policy.spares().iter().copied().collect();
            let groups_before: BTreeMap<usize, Vec<usize>> =
                policy.groups().map(|(id, m)| (id, m.to_vec())).collect();
            let mut allowed = spares_before.clone();
            let mut touched_group = None;
            if join || candidates.is_empty() {
                candidates.push(fresh(&mut next_index));
            } else {
                let victim = candidates.remove(pick.index(candidates.len())).node_index;
                if let Some(Some(id)) = before.get(&victim) {
                    touched_group = Some(*id);
                    allowed.extend(groups_before[id].iter().copied());
                }
            }
            let change = policy.update_membership(&candidates, width).unwrap();
            check_invariants(&policy, &candidates, width, group_size);
            for moved in &change.moved {
                prop_assert!(allowed.contains(moved), "node {} moved", moved);
            }
            // Groups other than the leaver's only gain members.
            let after: BTreeMap<usize, Vec<usize>> = policy.groups().map(|(id, m)| (id, m.to_vec())).collect();
            for (id, members) in &groups_before {
                if Some(*id) == touched_group {
                    continue;
                }
                let now = after.get(id).cloned().unwrap_or_default();
                prop_assert!(members.iter().all(|m| now.contains(m)), "group {} lost a member", id);
            }
        }
    }
}
