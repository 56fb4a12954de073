//! Making the engine over a client's regions: new ones (one per scheme the policy needs, EOR's
//! main copies beside the EC region), or those of a reopened slab map, checked against the
//! flags.

use remem_client::engine::RegionInfo;
use remem_client::{Client, ConnectError, PollClient, Shape};

use super::growth::MainRanges;
use super::mirror::StateRegion;
use super::rewrites::JOURNAL_PAGES;
use crate::cache::{Cache, CacheConfig};
use crate::error::RegionsError;
use crate::page_client::PageClient;
use crate::pageio::PAGE_OPS_IN_FLIGHT;
use crate::scheme::{region_shape, schemes_needed, Scheme};
use crate::space;

/// What `remem status` and the client's region report call the region of EOR values' main
/// copies (its scheme, `none`, is also that of `none` values).
pub const MAIN_COPIES_LABEL: &str = "EOR main copies";

/// Builds the cache over a connected client whose first region, if it has one, is the EC
/// region of `region_bytes` (else it is made here): adds the other schemes' regions.
pub fn build_cache(
    mut client: Client,
    config: CacheConfig,
    region_bytes: u64,
) -> Result<Cache, ConnectError> {
    let needed = schemes_needed(&config.policy);
    let ec_region = match client.regions().first() {
        Some(&region) => region,
        None => client.create_region(region_shape(Scheme::Ec, config.ec), region_bytes)?,
    };
    for scheme in [Scheme::None, Scheme::Rep2, Scheme::Rep3] {
        if needed.contains(&scheme) {
            client.create_region(region_shape(scheme, config.ec), region_bytes)?;
        }
    }
    if needed.contains(&Scheme::Eor) {
        let none = region_shape(Scheme::None, config.ec);
        client.create_region_beside(none, ec_region.page_count * 4096, &ec_region, config.ec.data_splits)?;
    }
    cache_over_regions(client, config).map_err(|message| unreachable!("regions made just now: {message}"))
}

/// The cache over a client that has its regions already (a reopened slab map): the EC region,
/// then none, rep2 and rep3 when the policy needs them, then EOR's main copies beside the EC
/// region, in the order [`build_cache`] makes them. Errors when the client's regions are not
/// those (a map saved with other schemes or another shape).
pub fn cache_over_regions(client: Client, config: CacheConfig) -> Result<Cache, RegionsError> {
    cache_over(client, config, false)
}

/// The shape of the state region (`remem kv --etcd`, `crate::cache::mirror`): rep(r+1), which
/// survives the r failures EC(k,r) does and whose copies are each whole.
pub fn state_region_shape(ec: crate::scheme::EcShape) -> Shape {
    Shape { data_splits: 1, parity_splits: ec.parity_splits, extra_reads: 0 }
}

/// As [`cache_over_regions`] for a client whose last region is the state region (a slab map
/// saved by `remem kv --etcd`): the cache over the others, and where the state region lies.
/// Errors as [`cache_over_regions`], and when the last region is not the state region's shape.
pub fn cache_over_regions_and_state(
    client: Client,
    config: CacheConfig,
) -> Result<(Cache, StateRegion), RegionsError> {
    let Some(last) = client.regions().last().copied() else {
        return Err(RegionsError::Shapes { have: Vec::new(), want: vec!["a state region".into()] });
    };
    let want = state_region_shape(config.ec);
    if (last.shape.data_splits, last.shape.parity_splits) != (want.data_splits, want.parity_splits) {
        return Err(RegionsError::Shapes {
            have: vec![format!("({},{}) last", last.shape.data_splits, last.shape.parity_splits)],
            want: vec![format!("(1,{}) last: the state region", want.parity_splits)],
        });
    }
    let first_range = first_range_of(client.ranges(), last.index);
    let mut cache = cache_over(client, config, true)?;
    cache.client_mut().client().label_region(last.index, STATE_LABEL);
    let region = StateRegion {
        first_page: last.first_page,
        page_count: last.page_count,
        first_range,
        pages_per_range: last.pages_per_range,
    };
    Ok((cache, region))
}

/// What `remem status` calls the state region.
pub const STATE_LABEL: &str = "kv state";

fn cache_over(mut client: Client, config: CacheConfig, state_last: bool) -> Result<Cache, RegionsError> {
    let mut regions = client.regions();
    if state_last {
        regions.pop();
    }
    if let (true, Some(main)) = (schemes_needed(&config.policy).contains(&Scheme::Eor), regions.last()) {
        client.label_region(main.index, MAIN_COPIES_LABEL);
    }
    client.set_max_in_flight(PAGE_OPS_IN_FLIGHT);
    cache_over_page_client(PollClient::new(client), &regions, config)
}

/// The cache over `regions` of a page client, in the order [`build_cache`] makes them (the EC
/// region, then none, rep2 and rep3 when the policy needs them, then EOR's main copies beside
/// the EC region; ranges mapped lazily, the mapped ones a prefix of each region). The
/// simulator's page client builds its cache here too. Errors when the regions are not those.
pub fn cache_over_page_client<P: PageClient>(
    mut client: P,
    regions: &[RegionInfo],
    config: CacheConfig,
) -> Result<Cache<P>, RegionsError> {
    let needed = schemes_needed(&config.policy);
    let mut expected = vec![(Some(space::RegionKind::Ec), region_shape(Scheme::Ec, config.ec))];
    for (scheme, kind) in [
        (Scheme::None, space::RegionKind::None),
        (Scheme::Rep2, space::RegionKind::Rep2),
        (Scheme::Rep3, space::RegionKind::Rep3),
    ] {
        if needed.contains(&scheme) {
            expected.push((Some(kind), region_shape(scheme, config.ec)));
        }
    }
    if needed.contains(&Scheme::Eor) {
        expected.push((None, region_shape(Scheme::None, config.ec)));
    }
    let shapes = |shapes: Vec<Shape>| {
        shapes
            .iter()
            .map(|shape| format!("({},{})", shape.data_splits, shape.parity_splits))
            .collect::<Vec<_>>()
    };
    let have: Vec<Shape> = regions.iter().map(|region| region.shape).collect();
    let want: Vec<Shape> = expected.iter().map(|(_, shape)| *shape).collect();
    let same = have.len() == want.len()
        && have
            .iter()
            .zip(&want)
            .all(|(a, b)| (a.data_splits, a.parity_splits) == (b.data_splits, b.parity_splits));
    if !same {
        return Err(RegionsError::Shapes { have: shapes(have), want: shapes(want) });
    }
    let mut space = space::Space::new();
    let mut main_first_page = None;
    let mut main_ranges = None;
    let mut journal_first_page = 0;
    for (region, (kind, _)) in regions.iter().zip(&expected) {
        let first_range = first_range_of(client.engine().ranges(), region.index);
        let range_count = region.page_count.div_ceil(region.pages_per_range) as usize;
        let grid = space::RangeGrid {
            origin: region.first_page,
            pages_per_range: region.pages_per_range,
            first_range,
            mapped: mapped_prefix(&mut client, first_range, range_count),
        };
        match kind {
            // The EC region's first pages are the journal of chunk page rewrites (in its first
            // range, mapped before any value page).
            Some(space::RegionKind::Ec) => {
                if region.page_count <= 2 * JOURNAL_PAGES {
                    return Err(RegionsError::EcTooSmall { pages: region.page_count });
                }
                let values = region.page_count - JOURNAL_PAGES;
                journal_first_page = region.first_page;
                space.add_ranged_region(
                    space::RegionKind::Ec,
                    region.first_page + JOURNAL_PAGES,
                    values,
                    grid,
                );
            }
            Some(kind) => space.add_ranged_region(*kind, region.first_page, region.page_count, grid),
            None => {
                main_first_page = Some(region.first_page);
                main_ranges =
                    Some(MainRanges { first_range, pages_per_range: region.pages_per_range, range_count });
            }
        }
    }
    let mut cache = Cache::new(client, space, config, main_first_page);
    cache.set_journal(journal_first_page);
    cache.set_main_ranges(main_ranges);
    Ok(cache)
}

/// The client's index of the first range of region `region`.
fn first_range_of(ranges: &[remem_client::engine::Range], region: usize) -> usize {
    ranges.iter().position(|range| range.region == region).expect("a region has a range")
}

/// How many of the region's ranges from `first_range` are mapped before the first that is
/// not. A range mapped after that one (none is, as ranges are mapped in order and released
/// from the last) holds nothing the cache knows of: it is given back.
fn mapped_prefix<P: PageClient>(client: &mut P, first_range: usize, range_count: usize) -> u64 {
    let ranges = first_range..first_range + range_count;
    let prefix = ranges.clone().take_while(|&range| client.engine().range_mapped(range)).count();
    for range in ranges.skip(prefix + 1) {
        if client.engine().range_mapped(range) {
            tracing::warn!(range, "a range mapped beyond the region's first unmapped one: given back");
            client.release_range(range);
        }
    }
    prefix as u64
}
