//! The rebuild machine driven by a shell of a few lines: the sources are slabs of the same core,
//! read directly; a source listed in `down` fails whenever it is asked.

use super::*;
use crate::core::rebuild::RebuildRequest;
use crate::core::{Backing, CoreConfig, NodeCore, Slab, SlabLabel};
use remem_codec::CodecParams;
use std::sync::Arc;
use std::time::Duration;

const CLIENT: u64 = 7;
const K: u8 = 2;
const R: u8 = 2;
const PAGE_BYTES: u32 = 4096;
const SPLIT_BYTES: u32 = PAGE_BYTES / K as u32;
const PAGES: u32 = 20;

struct Setup {
    core: NodeCore,
    /// The slabs of splits 0..k+r, the target's included.
    slabs: Vec<Arc<Slab>>,
    slab_ids: Vec<u32>,
}

fn setup() -> Setup {
    let core = NodeCore::new(CoreConfig {
        node_id: 1,
        capacity_bytes: 1 << 24,
        slab_size_bytes: 1 << 16,
        failure_domain: String::new(),
        fault_injection: false,
        backing: Backing::Heap,
        lease_grace: Duration::from_secs(1),
        lease_timeout: Duration::from_secs(1),
    });
    let mut slabs = Vec::new();
    let mut slab_ids = Vec::new();
    for split_index in 0..K + R {
        let label = SlabLabel { split_bytes: SPLIT_BYTES, split_index, first_page: 100, range_id: 0 };
        let (slab_id, _) = core.table.map(CLIENT, label).expect("room for four slabs");
        slabs.push(core.table.get(CLIENT, slab_id).expect("just mapped"));
        slab_ids.push(slab_id);
    }
    Setup { core, slabs, slab_ids }
}

fn params() -> CodecParams {
    CodecParams::new(usize::from(K), usize::from(R), PAGE_BYTES as usize).expect("a valid code")
}

/// Writes page `slot` at `version` to every slab but `skip`'s; returns the target's split.
fn write_page(setup: &Setup, slot: u32, version: u8, skip: usize) -> Vec<u8> {
    let params = params();
    let page: Vec<u8> = (0..PAGE_BYTES).map(|byte| (byte as u8) ^ (slot as u8) ^ version).collect();
    let mut parity = vec![0; params.parity_bytes()];
    new_codec(params).encode(&page, &mut parity);
    let mut target = Vec::new();
    for (split_index, slab) in setup.slabs.iter().enumerate() {
        let split_bytes = SPLIT_BYTES as usize;
        let split = if split_index < usize::from(K) {
            &page[split_index * split_bytes..(split_index + 1) * split_bytes]
        } else {
            let parity_index = split_index - usize::from(K);
            &parity[parity_index * split_bytes..(parity_index + 1) * split_bytes]
        };
        if split_index == skip {
            target = split.to_vec();
            continue;
        }
        let checksum = remem_proto::split_checksum(split, version, 100 + u64::from(slot), split_index as u8);
        slab.write(slot, split, SplitMeta { version, checksum });
    }
    target
}

fn steps(setup: &Setup, target: usize, batch_slots: u32) -> RebuildSteps {
    let sources = (0..setup.slabs.len())
        .filter(|split_index| *split_index != target)
        .rev()
        .map(|split_index| RegenerationSource {
            split_index: split_index as u8,
            slab_id: setup.slab_ids[split_index],
            address: "10.0.0.1:7077".parse().expect("an address"),
        })
        .collect();
    let request = RebuildRequest {
        slab_id: setup.slab_ids[target],
        data_splits: K,
        parity_splits: R,
        page_bytes: PAGE_BYTES,
        pages: PAGES,
        sources,
    };
    let admission = setup.core.admit_rebuild(CLIENT, request).expect("admitted");
    RebuildSteps::new(admission, batch_slots)
}

/// Runs the rebuild to its end; returns the outcome and the wants seen.
fn drive(setup: &Setup, steps: &mut RebuildSteps, down: &[u8]) -> (RebuildOutcome, Vec<Want>) {
    let mut seen = Vec::new();
    let mut split = vec![0; SPLIT_BYTES as usize];
    let slab_of = |steps: &RebuildSteps, position: usize| {
        let split_index = steps.sources()[position].split_index;
        (down.contains(&split_index), &setup.slabs[usize::from(split_index)])
    };
    loop {
        let want = steps.wants();
        seen.push(want);
        match want {
            Want::NextBatch { .. } => steps.begin_batch(),
            Want::Batch { sources, .. } => {
                for position in sources.iter() {
                    match slab_of(steps, position) {
                        (true, _) => steps.source_failed(position),
                        (false, _) => steps.batch_read(position),
                    }
                }
            }
            Want::Page { slot, sources, .. } | Want::Single { slot, sources } => {
                for position in sources.iter() {
                    let (down, slab) = slab_of(steps, position);
                    if down {
                        steps.source_failed(position);
                        continue;
                    }
                    let meta = slab.read(slot, &mut split);
                    steps.offer_split(position, Some(meta), &split, None);
                }
            }
            Want::Done(outcome) => return (outcome, seen),
        }
    }
}

#[test]
fn parity_split_is_rebuilt_from_the_data_splits_alone() {
    let setup = setup();
    let expected: Vec<Vec<u8>> = (0..PAGES / 2).map(|slot| write_page(&setup, slot, 3, 2)).collect();
    let mut steps = steps(&setup, 2, 8);
    assert_eq!(steps.sources().iter().map(|source| source.split_index).collect::<Vec<_>>(), [0, 1, 3]);
    let (outcome, seen) = drive(&setup, &mut steps, &[]);
    assert_eq!(
        outcome,
        RebuildOutcome {
            pages_rebuilt: u64::from(PAGES / 2),
            pages_skipped: u64::from(PAGES / 2),
            pages_lost: 0,
            sources_failed: 0,
            end: RebuildEnd::Complete,
        }
    );
    assert!(!seen.iter().any(|want| matches!(want, Want::Single { .. })), "k sources settle every page");
    let mut split = vec![0; SPLIT_BYTES as usize];
    for (slot, expected) in expected.iter().enumerate() {
        let meta = setup.slabs[2].read(slot as u32, &mut split);
        assert_eq!(&split, expected);
        assert_eq!(judge_split(&split, meta, 100 + slot as u64, 2), SplitVerdict::Valid { version: 3 });
    }
    assert_eq!(steps.take_progress(), u64::from(PAGES));
    assert_eq!(steps.take_progress(), 0);
}

#[test]
fn corrupt_split_sends_the_machine_to_the_other_source_for_that_page_only() {
    let setup = setup();
    let expected: Vec<Vec<u8>> = (0..PAGES).map(|slot| write_page(&setup, slot, 5, 0)).collect();
    setup.slabs[1].flip_bit(4, 17);
    setup.slabs[1].flip_bit(6, 3);
    setup.slabs[3].flip_bit(6, 5);
    let mut steps = steps(&setup, 0, 8);
    let (outcome, seen) = drive(&setup, &mut steps, &[]);
    assert_eq!((outcome.pages_rebuilt, outcome.pages_lost), (u64::from(PAGES) - 1, 1));
    let singles: Vec<u32> = seen
        .iter()
        .filter_map(|want| match want {
            Want::Single { slot, sources } => {
                assert_eq!(
                    sources.iter().map(|position| steps.sources()[position].split_index).collect::<Vec<_>>(),
                    [3]
                );
                Some(*slot)
            }
            _ => None,
        })
        .collect();
    assert_eq!(singles, [4, 6], "only the pages the batch does not settle are asked alone");
    let mut split = vec![0; SPLIT_BYTES as usize];
    assert_eq!(setup.slabs[0].read(6, &mut split), SplitMeta::default(), "a lost page stays unwritten");
    for slot in [4, 5] {
        setup.slabs[0].read(slot, &mut split);
        assert_eq!(split, expected[slot as usize]);
    }
}

#[test]
fn a_source_that_fails_is_replaced_and_fewer_than_k_end_the_rebuild() {
    let setup = setup();
    for slot in 0..PAGES {
        write_page(&setup, slot, 1, 3);
    }
    let mut steps = steps(&setup, 3, 8);
    let (outcome, seen) = drive(&setup, &mut steps, &[0]);
    let batches: Vec<SourceSet> = seen
        .iter()
        .filter_map(|want| match want {
            Want::Batch { sources, .. } => Some(*sources),
            _ => None,
        })
        .collect();
    // Split 0 fails on the first batch and split 2 takes its place, for good.
    assert_eq!(
        batches.iter().map(|sources| sources.iter().collect::<Vec<_>>()).collect::<Vec<_>>(),
        [vec![0, 1], vec![2], vec![1, 2], vec![1, 2]]
    );
    assert_eq!(
        (outcome.pages_rebuilt, outcome.pages_lost, outcome.sources_failed, outcome.end),
        (u64::from(PAGES), 0, 1, RebuildEnd::Complete)
    );

    let setup = self::setup();
    for slot in 0..PAGES {
        write_page(&setup, slot, 1, 3);
    }
    let mut steps = self::steps(&setup, 3, 8);
    let (outcome, _) = drive(&setup, &mut steps, &[0, 2]);
    assert_eq!(
        (outcome.pages_lost, outcome.sources_failed, outcome.end),
        (u64::from(PAGES), 2, RebuildEnd::TooFewSources)
    );
}

#[test]
fn metadata_that_does_not_decode_is_corrupt_not_never_written() {
    let setup = setup();
    let mut steps = steps(&setup, 2, 8);
    let payload = vec![0; SPLIT_BYTES as usize];
    assert!(matches!(steps.wants(), Want::NextBatch { first_slot: 0, count: 8 }));
    steps.begin_batch();
    let Want::Batch { sources, .. } = steps.wants() else { panic!("a batch wanted") };
    for position in sources.iter() {
        steps.batch_read(position);
    }
    let Want::Page { slot: 0, sources, .. } = steps.wants() else { panic!("page 0 wanted") };
    let mut positions = sources.iter();
    let first = positions.next().expect("two sources");
    steps.offer_split(first, None, &payload, None);
    let second = positions.next().expect("two sources");
    steps.offer_split(second, Some(SplitMeta::default()), &payload, None);
    // One vote for "never written" and one corrupt split: not k votes, so the third source is
    // asked; its "never written" makes k, and the page is skipped.
    let Want::Single { slot: 0, sources } = steps.wants() else { panic!("page 0 asked of the others") };
    let third = sources.iter().next().expect("one more source");
    assert_eq!(sources.len(), 1);
    steps.offer_split(third, Some(SplitMeta::default()), &payload, None);
    assert!(matches!(steps.wants(), Want::Page { slot: 1, .. }));
    assert_eq!(steps.take_progress(), 1);
    steps.abandon();
    let Want::Done(outcome) = steps.wants() else { panic!("abandoned") };
    assert_eq!(
        (outcome.pages_skipped, outcome.pages_lost, outcome.end),
        (1, u64::from(PAGES) - 1, RebuildEnd::Abandoned)
    );
}

#[test]
fn a_batch_the_client_wrote_whole_is_skipped_unread_and_an_evicted_slab_ends_the_rebuild() {
    let setup = setup();
    for slot in 0..PAGES {
        write_page(&setup, slot, 2, usize::MAX);
    }
    let mut steps = steps(&setup, 3, 8);
    assert_eq!(steps.wants(), Want::NextBatch { first_slot: 0, count: 8 });
    steps.begin_batch();
    // Every slot of the target is written (the client's writes go to the new slab at once).
    assert_eq!(steps.wants(), Want::NextBatch { first_slot: 8, count: 8 });
    assert_eq!(steps.take_progress(), 8);
    setup.core.table.evict(setup.slab_ids[3]).expect("mapped");
    steps.begin_batch();
    let Want::Done(outcome) = steps.wants() else { panic!("the slab is gone") };
    assert_eq!(
        (outcome.pages_skipped, outcome.pages_lost, outcome.end),
        (8, u64::from(PAGES) - 8, RebuildEnd::SlabGone)
    );
    assert_eq!(steps.take_progress(), u64::from(PAGES) - 8);
}
