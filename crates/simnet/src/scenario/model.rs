//! The reference model of a scenario's pages and the check of every completion against it.
//!
//! Per page: the generations a read may return, whether a read may fail, and whether the page
//! is parity-stale (its last successful write was data splits only). A parity-stale page
//! survives no data-slab loss (its main copy elsewhere does, which the scenario does not model):
//! a read of it may fail at any time, within tolerance too, but must never return wrong bytes.
//! Data-only and parity writes may fail within tolerance (a data slab down and not yet being
//! rebuilt; a data split lost before the parities came): an error, never wrong data. Whole
//! writes must not.

use super::*;
use crate::driver::SimOpKind;

/// The reference model of one page.
#[derive(Clone, Debug)]
pub(super) struct PageModel {
    /// Generations a read may return now (0: zeros).
    pub(super) acceptable: Vec<u64>,
    /// A read may fail (a failed or torn write) until the next successful write.
    pub(super) may_fail: bool,
    /// Written data splits only since the last successful whole or parity write.
    pub(super) parity_stale: bool,
    /// Every generation ever submitted.
    pub(super) written: Vec<u64>,
    pub(super) next_generation: u64,
    /// Ops outstanding on the page.
    pub(super) busy: u32,
}

impl PageModel {
    pub(super) fn new() -> PageModel {
        PageModel {
            acceptable: vec![0],
            may_fail: false,
            parity_stale: false,
            written: vec![0],
            next_generation: 1,
            busy: 0,
        }
    }

    /// The one generation the page holds, when the model knows it exactly: what a parity write
    /// may be given (its content must be what the data splits hold).
    pub(super) fn exact(&self) -> Option<u64> {
        match self.acceptable[..] {
            [generation] if !self.may_fail && generation != 0 => Some(generation),
            _ => None,
        }
    }
}

/// An op the runner is waiting for.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pending {
    pub(super) page: u64,
    pub(super) kind: SimOpKind,
    /// The generation of a write (for a parity write: the one it completes).
    pub(super) generation: Option<u64>,
}

/// Which written generations each 512-byte piece of `data` matches ('?' for none), to tell a mix
/// of generations from garbage.
fn describe_pieces(page: u64, data: &[u8], written: &[u64]) -> String {
    let patterns: Vec<(u64, Vec<u8>)> = written
        .iter()
        .map(|&generation| {
            let bytes = if generation == 0 { vec![0; PAGE_BYTES] } else { page_pattern(page, generation) };
            (generation, bytes)
        })
        .collect();
    data.chunks(512)
        .enumerate()
        .map(|(piece, chunk)| {
            let matches: Vec<String> = patterns
                .iter()
                .filter(|(_, bytes)| &bytes[piece * 512..piece * 512 + chunk.len()] == chunk)
                .map(|(generation, _)| generation.to_string())
                .collect();
            if matches.is_empty() {
                "?".to_owned()
            } else {
                matches.join("|")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Run<'_> {
    /// Checks one completion against the model and updates it.
    pub(super) fn check(&mut self, completion: Completion) -> Result<(), String> {
        let pending = self.pending.remove(&completion.id).expect("completions are of submitted ops");
        let id = completion.id;
        self.driver.note(|| format!("op {id} done: {:?}", completion.result.as_ref().map(|_| ())));
        let page = pending.page;
        let within = self.plan.tolerance == Tolerance::Within;
        let crashed = self.crashed;
        let model = &mut self.pages[page as usize];
        model.busy -= 1;
        let at = completion.completed_at;
        let report = &mut self.report;
        match (pending.kind, pending.generation, completion.result) {
            (SimOpKind::Write, Some(generation), Ok(())) => {
                report.writes_ok += 1;
                model.acceptable = vec![generation];
                model.may_fail = false;
                model.parity_stale = false;
            }
            (SimOpKind::WriteData, Some(generation), Ok(())) => {
                report.write_data_ok += 1;
                model.acceptable = vec![generation];
                model.may_fail = false;
                model.parity_stale = true;
            }
            (SimOpKind::WriteParity, Some(_), Ok(())) => {
                report.write_parity_ok += 1;
                model.parity_stale = false;
            }
            // A parity write that fails changes nothing the model can see: the page stays
            // parity-stale (its version and bytes do not change).
            (SimOpKind::WriteParity, Some(_), Err(_)) => report.write_parity_failed += 1,
            (kind, Some(generation), Err(error)) => {
                if kind == SimOpKind::WriteData {
                    report.write_data_failed += 1;
                } else {
                    report.writes_failed += 1;
                    if within {
                        return Err(format!(
                            "at {at} ns: write of page {page} generation {generation} failed within tolerance: \
                             {error}"
                        ));
                    }
                }
                if !model.acceptable.contains(&generation) {
                    model.acceptable.push(generation);
                }
                model.may_fail = true;
            }
            (SimOpKind::Read, _, Ok(())) => {
                report.reads_ok += 1;
                report.reads_decoded += u64::from(completion.decoded);
                // (Unless a failed write left the version to be found again: a parity write that
                // failed may still have stored parities of it.)
                if model.parity_stale && !model.may_fail && completion.decoded {
                    return Err(format!(
                        "at {at} ns: read of parity-stale page {page} decoded with a parity"
                    ));
                }
                let Some((returned_page, generation)) = identify(page, &completion.data) else {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned bytes that are no generation of any page \
                         (a mix or garbage); the model allows generations {:?}; by 512-byte piece, the \
                         generations each piece matches: {}",
                        model.acceptable,
                        describe_pieces(page, &completion.data, &model.written)
                    ));
                };
                if returned_page != page {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned page {returned_page} generation {generation}"
                    ));
                }
                let allowed = if !within && crashed { &model.written } else { &model.acceptable };
                if !allowed.contains(&generation) {
                    return Err(format!(
                        "at {at} ns: read of page {page} returned generation {generation}; the model allows {:?} \
                         (written: {:?})",
                        allowed, model.written
                    ));
                }
            }
            (SimOpKind::Read, _, Err(error)) => {
                report.reads_failed += 1;
                if model.parity_stale {
                    report.parity_stale_reads_failed += 1;
                } else if within && !model.may_fail {
                    return Err(format!(
                        "at {at} ns: read of page {page} failed within tolerance: {error} (model: generation {:?})",
                        model.acceptable
                    ));
                }
            }
            (kind, None, _) => unreachable!("a {kind:?} is submitted with its generation"),
        }
        Ok(())
    }
}
