"""The instance catalog and its price refresh, against recorded price-API responses."""

from __future__ import annotations

import copy
import datetime
import json
import shutil
import urllib.parse
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY, Stubber

from infra import catalog
from infra.catalog import refresh
from infra.catalog.refresh import RefreshError
from infra.catalog.refresh import aws as refresh_aws
from infra.catalog.refresh import azure as refresh_azure
from infra.catalog.refresh import gcp as refresh_gcp
from infra.core import perf
from tests.conftest import CATALOG_FIXTURE, REPO
from tests.pulumi_mocks import program_settings, stack_names

FIXTURES = REPO / "tests" / "fixtures" / "prices"
TODAY = datetime.date(2026, 11, 22)
# The product's own CSVs, read by path: the session reads the fixture catalog.
PRODUCT_CSVS = {
    "instances": catalog.CATALOG_FILE,
    "cpus": catalog.CPUS_FILE,
    "services": catalog.SERVICES_FILE,
    "disks": catalog.DISKS_FILE,
}
FIXTURE_CSVS = {
    "instances": CATALOG_FIXTURE / catalog.INSTANCES_NAME,
    "cpus": CATALOG_FIXTURE / catalog.CPUS_NAME,
    "services": CATALOG_FIXTURE / catalog.SERVICES_NAME,
    "disks": CATALOG_FIXTURE / catalog.DISKS_NAME,
}
BOTH = pytest.mark.parametrize("files", [PRODUCT_CSVS, FIXTURE_CSVS], ids=["product", "fixture"])


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def csv_copy(tmp_path: Path) -> Path:
    """A copy of the catalog the tests read, for a refresh to rewrite."""
    path = tmp_path / "instances.csv"
    shutil.copy(FIXTURE_CSVS["instances"], path)
    return path


@BOTH
def test_every_row_has_a_source_and_prices_are_dated_or_unknown(files: dict[str, Path]) -> None:
    rows = catalog.load(files["instances"])
    assert {e.provider for e in rows} == {"aws", "gcp", "azure"}
    families = catalog.cpu_families(files["cpus"])
    for e in rows:
        assert e.arch == "arm64" and e.vcpus > 0 and e.memory_gib > 0, e
        assert e.cpu_family in families, e
        assert e.price_source, e
        if e.hourly_usd is not None:
            datetime.date.fromisoformat(e.price_date)
        assert e.spot_price_source, e
        if e.spot_hourly_usd is not None:
            datetime.date.fromisoformat(e.spot_price_date)
    for price in catalog.service_prices(files["services"]).values():
        assert price.source and price.unit, price
        if price.usd is not None:
            datetime.date.fromisoformat(price.date)
    where = {(e.provider, e.region) for e in rows}
    assert {("aws", "us-east-1"), ("gcp", "us-central1"), ("azure", "eastus")} <= where


def test_aws_prices_are_linear_in_size_within_a_family() -> None:
    """AWS prices a family per vCPU: a mistyped price breaks the line, a refresh does not."""
    families: dict[tuple[str, str], list[catalog.InstanceType]] = {}
    for e in catalog.load(PRODUCT_CSVS["instances"]):
        if e.provider == "aws" and e.hourly_usd is not None:
            families.setdefault((e.region, e.name.split(".")[0]), []).append(e)
    assert any(len(members) > 2 for members in families.values())
    for members in families.values():
        largest = max(members, key=lambda e: e.vcpus)
        per_vcpu = (largest.hourly_usd or 0) / largest.vcpus
        for e in members:  # prices are rounded to 5 decimals
            assert e.hourly_usd == pytest.approx(per_vcpu * e.vcpus, abs=2e-5), e


def test_gcp_c4a_prices_are_one_price_per_vcpu_plus_one_per_gib() -> None:
    """C4A is priced per resource: in each region two types fix the vCPU and GiB prices, the rest
    follow."""
    regions: dict[str, list[catalog.InstanceType]] = {}
    for e in catalog.load(PRODUCT_CSVS["instances"]):
        if e.provider == "gcp" and e.hourly_usd:
            regions.setdefault(e.region, []).append(e)
    assert "us-central1" in regions
    for rows in regions.values():
        by_name = {e.name: e for e in rows}
        low, high = by_name["c4a-standard-32"], by_name["c4a-highmem-32"]  # same vCPUs, more GiB
        assert low.vcpus == high.vcpus and low.hourly_usd and high.hourly_usd
        per_gib = (high.hourly_usd - low.hourly_usd) / (high.memory_gib - low.memory_gib)
        per_vcpu = (low.hourly_usd - per_gib * low.memory_gib) / low.vcpus
        assert per_vcpu > 0 and per_gib > 0
        for e in rows:
            expected = e.vcpus * per_vcpu + e.memory_gib * per_gib
            assert e.hourly_usd == pytest.approx(expected, abs=5e-5), e


@BOTH
def test_writing_the_catalog_back_changes_nothing(files: dict[str, Path], tmp_path: Path) -> None:
    """The CSV is in the form the refresh writes, so a refresh's diff is only its prices."""
    copy_ = tmp_path / "instances.csv"
    refresh.write(catalog.load(files["instances"]), copy_)
    assert copy_.read_text() == files["instances"].read_text()


def test_the_tests_read_the_fixture_catalog() -> None:
    assert catalog.directory() == CATALOG_FIXTURE
    assert catalog.load() == catalog.load(FIXTURE_CSVS["instances"])
    assert catalog.service_prices() == catalog.service_prices(FIXTURE_CSVS["services"])
    assert catalog.cpu_families() == catalog.cpu_families(FIXTURE_CSVS["cpus"])
    assert catalog.disk_bandwidths() == catalog.disk_bandwidths(FIXTURE_CSVS["disks"])


@BOTH
def test_every_aws_type_has_its_published_disk_bandwidth(files: dict[str, Path]) -> None:
    """The planner caps a main disk's reads at the type's EBS bandwidth: a type without one
    would be promised its volume's full throughput."""
    bandwidths = catalog.disk_bandwidths(files["disks"])
    aws_types = {e.name for e in catalog.load(files["instances"]) if e.provider == "aws"}
    assert {name for provider, name in bandwidths if provider == "aws"} == aws_types
    for entry in bandwidths.values():
        assert 0 < entry.baseline_mbps <= entry.max_mbps, entry
        assert entry.source.startswith("AWS EC2") and entry.date, entry
        # Only the types below 8xlarge burst, for 30 minutes.
        small = entry.instance_type.split(".")[1] in ("large", "xlarge", "2xlarge", "4xlarge")
        assert entry.burst_minutes == (30 if small else 0), entry
    c8g = bandwidths["aws", "c8g.16xlarge"]
    assert c8g.baseline_mbps == c8g.max_mbps == 2500
    assert round(c8g.mibps_for(500e9)) == 2384  # 2,500 MB/s, whatever the size


def test_a_bursting_type_runs_at_its_maximum_while_the_burst_lasts() -> None:
    entry = catalog.DiskBandwidth("aws", "t", 100, 1000, 30, "test", "2026-01-01")
    burst = 1000e6 * 30 * 60  # bytes the 30 minutes at the maximum move
    assert entry.mibps_for(burst) * 1024**2 / 1e6 == pytest.approx(1000)
    # As much again at the baseline: 1,800 s + 18,000 s.
    assert entry.mibps_for(2 * burst) * 1024**2 / 1e6 == pytest.approx(2 * burst / 19_800 / 1e6)


def test_the_catalog_directory_is_read_at_each_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        catalog.INSTANCES_NAME,
        catalog.CPUS_NAME,
        catalog.SERVICES_NAME,
        catalog.DISKS_NAME,
    ):
        shutil.copy(CATALOG_FIXTURE / name, tmp_path / name)
    with (tmp_path / catalog.INSTANCES_NAME).open("a") as f:
        f.write("aws,eu-west-1,c8g.large,arm64,graviton4,2,4,12.5,0.1,test row,2026-02-01\n")
    assert catalog.find("aws", "eu-west-1", "c8g.large") is None
    monkeypatch.setenv(catalog.DIRECTORY_VARIABLE, str(tmp_path))
    assert catalog.find("aws", "eu-west-1", "c8g.large").hourly_usd == 0.1
    monkeypatch.delenv(catalog.DIRECTORY_VARIABLE)
    assert catalog.directory() == catalog.PACKAGE_DIR  # the product's own CSVs by default
    assert catalog.load() == catalog.load(PRODUCT_CSVS["instances"])
    monkeypatch.setenv(catalog.DIRECTORY_VARIABLE, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=r"LLAMA_RPC_CATALOG_DIR=.*absent: no instances"):
        catalog.load()


def test_the_fixture_describes_the_products_types() -> None:
    """Only prices, sources and dates may differ: sizes decide what fits and how fast it runs."""

    def specs(e: catalog.InstanceType) -> tuple:
        return (e.arch, e.cpu_family, e.vcpus, e.memory_gib, e.network_gbps)

    product = {(e.provider, e.region, e.name): e for e in catalog.load(PRODUCT_CSVS["instances"])}
    for e in catalog.load(FIXTURE_CSVS["instances"]):
        key = (e.provider, e.region, e.name)
        assert key in product, f"{key}: not a type of the product's catalog"
        assert specs(e) == specs(product[key]), key
    assert catalog.cpu_families(FIXTURE_CSVS["cpus"]) == catalog.cpu_families(PRODUCT_CSVS["cpus"])


def test_the_planners_anchors_and_the_presets_types_are_in_the_products_catalog() -> None:
    product = {(e.provider, e.region, e.name) for e in catalog.load(PRODUCT_CSVS["instances"])}
    for anchor in perf.ANCHORS:
        assert (anchor.provider, anchor.region, anchor.instance_type) in product, anchor
    for stack in stack_names():
        settings, region = program_settings(stack)
        for key in ("instanceType", "mainInstanceType"):
            if key in settings:
                assert (settings["cloud"], region, settings[key]) in product, (stack, key)


# --- AWS: botocore's Stubber checks each request against the real service model ---


def aws_page(instance_type: str, usd: str) -> dict:
    item = fixture("aws_get_products_c8g.16xlarge.json")
    item["product"]["attributes"]["instanceType"] = instance_type
    [term] = item["terms"]["OnDemand"].values()
    [dimension] = term["priceDimensions"].values()
    dimension["pricePerUnit"]["USD"] = usd
    return {"FormatVersion": "aws_v1", "PriceList": [json.dumps(item)]}


def pricing_client():
    return boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test"
    )


def ec2_client(region: str = "us-east-1"):
    return boto3.client(
        "ec2", region_name=region, aws_access_key_id="test", aws_secret_access_key="test"
    )


SPOT_PAGES = ("aws_spot_price_history_page1.json", "aws_spot_price_history_page2.json")


def expect_spot(stubber: Stubber, names: list[str], pages: list[dict]) -> None:
    """``describe_spot_price_history`` for these types, answered by these pages in turn."""
    token = None
    for page in pages:
        params = {
            "InstanceTypes": sorted(names),
            "ProductDescriptions": ["Linux/UNIX"],
            "StartTime": ANY,
        }
        if token:
            params["NextToken"] = token
        stubber.add_response("describe_spot_price_history", page, params)
        token = page.get("NextToken")


def expect(stubber: Stubber, instance_type: str, response: dict, token: str | None = None) -> None:
    params = {
        "ServiceCode": "AmazonEC2",
        "Filters": refresh_aws.filters("us-east-1", instance_type),
        "MaxResults": 100,
    }
    if token:
        params["NextToken"] = token
    stubber.add_response("get_products", response, params)


def test_aws_refresh_reads_on_demand_prices_and_follows_pages(csv_copy: Path) -> None:
    client, ec2 = pricing_client(), ec2_client()
    before = {e.name: e for e in catalog.load(csv_copy) if e.region == "us-east-1"}
    risen = round((before["c8g.16xlarge"].hourly_usd or 0) + 0.1, 5)
    with Stubber(client) as stubber, Stubber(ec2) as spot:
        expect_spot(spot, list(before), [{"SpotPriceHistory": []}])
        for name in sorted(e.name for e in before.values() if e.provider == "aws"):
            if name == "c8g.16xlarge":  # a price rise, on the second page
                expect(stubber, name, {"PriceList": [], "NextToken": "more"})
                expect(stubber, name, aws_page(name, f"{risen:.10f}"), token="more")
            elif name == "r6g.16xlarge":  # not offered: no products
                expect(stubber, name, {"PriceList": []})
            else:
                expect(stubber, name, aws_page(name, f"{before[name].hourly_usd:.10f}"))
        report = refresh.refresh(
            "aws", "us-east-1", aws_client=client, ec2_client=ec2, path=csv_copy, today=TODAY
        )
        stubber.assert_no_pending_responses()
        spot.assert_no_pending_responses()
    assert report.updated == [("c8g.16xlarge", before["c8g.16xlarge"].hourly_usd, risen)]
    assert report.not_found == ["r6g.16xlarge"]
    rows = {e.name: e for e in catalog.load(csv_copy) if e.region == "us-east-1"}
    assert rows["c8g.16xlarge"].hourly_usd == risen
    assert rows["c8g.16xlarge"].price_source == refresh_aws.SOURCE
    assert rows["c8g.16xlarge"].price_date == TODAY.isoformat()
    assert rows["r6g.16xlarge"] == before["r6g.16xlarge"]  # kept, with its old price and date
    assert rows["c8g.8xlarge"].price_date == TODAY.isoformat()  # same price, newly checked


def test_aws_refresh_of_a_new_region_adds_rows_with_the_known_specs(csv_copy: Path) -> None:
    client, ec2 = pricing_client(), ec2_client("eu-west-1")
    names = sorted({e.name for e in catalog.load(csv_copy) if e.provider == "aws"})
    with Stubber(client) as stubber, Stubber(ec2) as spot:
        expect_spot(spot, names, [{"SpotPriceHistory": []}])
        for name in names:
            params = {
                "ServiceCode": "AmazonEC2",
                "Filters": refresh_aws.filters("eu-west-1", name),
                "MaxResults": 100,
            }
            response = (
                aws_page(name, "3.0000000000") if name == "r8g.8xlarge" else {"PriceList": []}
            )
            stubber.add_response("get_products", response, params)
        report = refresh.refresh(
            "aws", "eu-west-1", aws_client=client, ec2_client=ec2, path=csv_copy, today=TODAY
        )
    assert report.added == [("r8g.8xlarge", 3.0)]
    [row] = [e for e in catalog.load(csv_copy) if e.region == "eu-west-1"]
    assert (row.vcpus, row.memory_gib, row.cpu_family) == (32, 256, "graviton4")
    assert (row.spot_hourly_usd, row.spot_price_source) == (None, catalog.SPOT_NOT_FETCHED)


def test_two_different_aws_prices_for_one_type_are_an_error() -> None:
    client = pricing_client()
    page = aws_page("c8g.16xlarge", "2.5")
    page["PriceList"].append(aws_page("c8g.16xlarge", "2.7")["PriceList"][0])
    with Stubber(client) as stubber:
        expect(stubber, "c8g.16xlarge", page)
        with pytest.raises(RefreshError, match=r"several on-demand prices for c8g\.16xlarge"):
            refresh_aws.aws_prices(client, "us-east-1", ["c8g.16xlarge"])


# --- Spot prices: their own columns, never mixed with on-demand ---


def test_the_catalog_reads_spot_prices_apart_from_on_demand() -> None:
    row = catalog.find("aws", "us-east-1", "c8g.16xlarge")
    assert row is not None
    assert (row.hourly_usd, row.price_date) == (2.55232, "2026-01-15")
    assert (row.spot_hourly_usd, row.spot_price_date) == (1.0208, "2026-01-14")
    assert "spot" in row.spot_price_source
    other = catalog.find("aws", "us-east-1", "c8g.8xlarge")
    assert other is not None and other.hourly_usd is not None
    assert (other.spot_hourly_usd, other.spot_price_source, other.spot_price_date) == (
        None, catalog.SPOT_NOT_FETCHED, "",
    )  # fmt: skip


def test_the_products_spot_prices_are_unknown_or_dated_never_invented() -> None:
    for e in catalog.load(PRODUCT_CSVS["instances"]):
        if e.spot_hourly_usd is None:
            assert e.spot_price_date == "", e
        else:  # only a refresh writes one, from a price API, with its date
            assert "spot" in e.spot_price_source.lower(), e
            datetime.date.fromisoformat(e.spot_price_date)
            assert e.spot_hourly_usd != e.hourly_usd, e


def test_a_catalog_without_the_spot_columns_reads_as_spot_unknown(tmp_path: Path) -> None:
    """A CSV written before the spot columns existed still loads, and is written back with them."""
    old = tmp_path / "instances.csv"
    lines = FIXTURE_CSVS["instances"].read_text().splitlines()
    old.write_text("".join(line.rsplit(",", 3)[0] + "\n" for line in lines))
    assert "spot" not in old.read_text()
    rows = catalog.load(old)
    assert len(rows) == len(lines) - 1
    for e in rows:
        assert (e.spot_hourly_usd, e.spot_price_source, e.spot_price_date) == (
            None, catalog.SPOT_NOT_FETCHED, "",
        )  # fmt: skip
    fixture_rows = {
        (e.provider, e.region, e.name): e for e in catalog.load(FIXTURE_CSVS["instances"])
    }
    for e in rows:
        assert e.hourly_usd == fixture_rows[(e.provider, e.region, e.name)].hourly_usd
    refresh.write(rows, old)
    header, first = old.read_text().splitlines()[:2]
    assert header.endswith(",price_date,spot_hourly_usd,spot_price_source,spot_price_date")
    assert first.endswith(f",unknown,{catalog.SPOT_NOT_FETCHED},")


def spot_records(*names: str) -> list[dict]:
    records = [r for page in SPOT_PAGES for r in fixture(page)["SpotPriceHistory"]]
    return [r for r in records if not names or r["InstanceType"] in names]


def test_aws_spot_is_the_lowest_current_price_of_the_regions_zones() -> None:
    found = refresh_aws.spot_from_history(spot_records())
    # Zone b's older, cheaper record is superseded; the cheaper Windows record is not Linux.
    assert found["c8g.16xlarge"] == refresh.SpotPrice(
        1.0312, "EC2 spot price history (Linux/UNIX), lowest of 6 zones", "2026-11-20"
    )
    assert found["c8g.8xlarge"] == refresh.SpotPrice(
        0.515, "EC2 spot price history (Linux/UNIX), lowest of 2 zones", "2026-11-21"
    )
    assert set(found) == {"c8g.16xlarge", "c8g.8xlarge"}
    # boto3 gives the Timestamps as datetimes, the recorded JSON as strings: the same answer.
    as_boto3 = [
        r | {"Timestamp": datetime.datetime.fromisoformat(r["Timestamp"])} for r in spot_records()
    ]
    assert refresh_aws.spot_from_history(as_boto3) == found
    assert refresh_aws.spot_from_history([]) == {}


def test_aws_spot_history_asks_for_linux_prices_as_of_now_and_follows_pages() -> None:
    ec2 = ec2_client()
    now = datetime.datetime(2026, 11, 22, 9, 30, tzinfo=datetime.UTC)
    with Stubber(ec2) as stubber:
        first, second = (fixture(page) for page in SPOT_PAGES)
        base = {"InstanceTypes": ["c8g.16xlarge", "c8g.8xlarge"],
                "ProductDescriptions": ["Linux/UNIX"], "StartTime": now}  # fmt: skip
        stubber.add_response("describe_spot_price_history", first, base)
        stubber.add_response("describe_spot_price_history", second, base | {"NextToken": "page-2"})
        records = refresh_aws.spot_history(ec2, ["c8g.8xlarge", "c8g.16xlarge"], now)
        stubber.assert_no_pending_responses()
    assert len(records) == len(first["SpotPriceHistory"]) + len(second["SpotPriceHistory"])


def aws_refresh_with_spot(csv_copy: Path, spot_pages: list[dict] | None) -> refresh.Report:
    """An AWS refresh of us-east-1 where every type keeps its on-demand price and EC2 answers
    these spot pages (None: EC2 refuses)."""
    client, ec2 = pricing_client(), ec2_client()
    before = {e.name: e for e in catalog.load(csv_copy) if e.provider == "aws"}
    with Stubber(client) as stubber, Stubber(ec2) as spot:
        for name in sorted(before):
            expect(stubber, name, aws_page(name, f"{before[name].hourly_usd:.10f}"))
        if spot_pages is None:
            spot.add_client_error(
                "describe_spot_price_history", "UnauthorizedOperation", "not authorized"
            )
        else:
            expect_spot(spot, list(before), spot_pages)
        report = refresh.refresh(
            "aws", "us-east-1", aws_client=client, ec2_client=ec2, path=csv_copy, today=TODAY
        )
        spot.assert_no_pending_responses()
    return report


def test_aws_refresh_writes_spot_to_the_spot_columns_only(csv_copy: Path) -> None:
    before = {e.name: e for e in catalog.load(csv_copy) if e.provider == "aws"}
    report = aws_refresh_with_spot(csv_copy, [fixture(page) for page in SPOT_PAGES])
    rows = {e.name: e for e in catalog.load(csv_copy) if e.provider == "aws"}
    big = rows["c8g.16xlarge"]
    # The spot price lands in the spot columns; the on-demand one stays in hourly_usd.
    assert (big.spot_hourly_usd, big.spot_price_date) == (1.0312, "2026-11-20")
    assert big.spot_price_source == "EC2 spot price history (Linux/UNIX), lowest of 6 zones"
    assert (big.hourly_usd, big.price_source, big.price_date) == (
        before["c8g.16xlarge"].hourly_usd, refresh_aws.SOURCE, TODAY.isoformat(),
    )  # fmt: skip
    assert rows["c8g.8xlarge"].spot_hourly_usd == 0.515
    # A type EC2 quotes no spot price for keeps its spot columns, with its on-demand price.
    assert rows["r8g.8xlarge"].spot_hourly_usd is None
    assert rows["r8g.8xlarge"].hourly_usd == before["r8g.8xlarge"].hourly_usd
    assert report.updated == []
    assert report.spot_updated == [("c8g.8xlarge", None, 0.515), ("c8g.16xlarge", 1.0208, 1.0312)]
    assert "r8g.8xlarge" in report.spot_not_found
    assert "  c8g.16xlarge: spot $1.0208 -> $1.0312/h" in report.lines()
    # No on-demand price became a spot one, nor the other way round.
    for e in rows.values():
        assert e.spot_hourly_usd is None or e.spot_hourly_usd < (e.hourly_usd or 0), e


def test_aws_refresh_without_spot_access_keeps_spot_and_writes_on_demand(csv_copy: Path) -> None:
    before = {e.name: e for e in catalog.load(csv_copy) if e.provider == "aws"}
    report = aws_refresh_with_spot(csv_copy, None)
    assert "UnauthorizedOperation" in report.spot_error and report.spot_not_found == []
    assert any("spot prices not fetched" in line for line in report.lines())
    for e in catalog.load(csv_copy):
        if e.provider == "aws":
            old = before[e.name]
            assert (e.spot_hourly_usd, e.spot_price_source, e.spot_price_date) == (
                old.spot_hourly_usd, old.spot_price_source, old.spot_price_date,
            )  # fmt: skip
            assert e.price_date == TODAY.isoformat()


def test_a_new_regions_row_never_inherits_another_regions_spot_price() -> None:
    entries = catalog.load(FIXTURE_CSVS["instances"])
    assert catalog.find("aws", "us-east-1", "c8g.16xlarge").spot_hourly_usd is not None
    quote = refresh.Quote("aws", "eu-west-1", {"c8g.16xlarge": 2.8}, "test", "2026-11-22")
    updated, report = refresh.apply(entries, quote)
    assert report.added == [("c8g.16xlarge", 2.8)]
    [row] = [e for e in updated if e.region == "eu-west-1"]
    assert (row.hourly_usd, row.spot_hourly_usd) == (2.8, None)
    assert (row.spot_price_source, row.spot_price_date) == (catalog.SPOT_NOT_FETCHED, "")
    spot = refresh.SpotPrice(1.1, "test spot", "2026-11-21")
    updated, _ = refresh.apply(entries, refresh.Quote(
        "aws", "eu-west-1", {"c8g.16xlarge": 2.8}, "test", "2026-11-22", {"c8g.16xlarge": spot}
    ))  # fmt: skip
    [row] = [e for e in updated if e.region == "eu-west-1"]
    assert (row.hourly_usd, row.spot_hourly_usd, row.spot_price_date) == (2.8, 1.1, "2026-11-21")


def test_a_spot_only_quote_leaves_the_on_demand_price_alone() -> None:
    entries = catalog.load(FIXTURE_CSVS["instances"])
    spot = refresh.SpotPrice(0.7, "test spot", "2026-11-21")
    quote = refresh.Quote("aws", "us-east-1", {}, "test", "2026-11-22", {"c8g.8xlarge": spot})
    updated, report = refresh.apply(entries, quote)
    row = next(e for e in updated if e.name == "c8g.8xlarge")
    old = next(e for e in entries if e.name == "c8g.8xlarge")
    assert (row.hourly_usd, row.price_source, row.price_date) == (
        old.hourly_usd, old.price_source, old.price_date,
    )  # fmt: skip
    assert row.spot_hourly_usd == 0.7 and "c8g.8xlarge" in report.not_found


# --- Azure and GCP: recorded JSON served by a fake transport ---


class Replay:
    """Answers price-API URLs from recorded pages and records what was asked."""

    def __init__(self, pages: dict[str, dict]) -> None:
        self.pages = pages
        self.urls: list[str] = []

    def __call__(self, url: str) -> dict:
        self.urls.append(url)
        for key, page in self.pages.items():
            if key in urllib.parse.unquote(url):
                return copy.deepcopy(page)
        return fixture("azure_retail_empty.json")


def test_azure_refresh_keeps_linux_pay_as_you_go_and_the_latest_price(csv_copy: Path) -> None:
    replay = Replay({
        "$skip=100": fixture("azure_retail_page2.json"),
        "armSkuName eq 'Standard_D64ps_v6'": fixture("azure_retail_page1.json"),
    })  # fmt: skip
    report = refresh.refresh("azure", "eastus", fetch=replay, path=csv_copy, today=TODAY)
    # Spot, Dev/Test and Windows rows are dropped; of two Linux rows the newest price wins.
    assert report.updated == [("Standard_D64ps_v6", None, 1.2345)]
    assert "Standard_E64ps_v6" in report.not_found
    row = next(e for e in catalog.load(csv_copy) if e.name == "Standard_D64ps_v6")
    assert (row.hourly_usd, row.price_source, row.price_date) == (
        1.2345, refresh_azure.SOURCE, TODAY.isoformat(),
    )  # fmt: skip
    # The Spot row is its spot price, in the spot columns.
    assert (row.spot_hourly_usd, row.spot_price_source, row.spot_price_date) == (
        0.1111, refresh_azure.SPOT_SOURCE, TODAY.isoformat(),
    )  # fmt: skip
    first = urllib.parse.unquote(replay.urls[0])
    assert first.startswith(refresh_azure.PRICES_URL)
    assert "armRegionName eq 'eastus'" in first and "priceType eq 'Consumption'" in first


def test_gcp_refresh_prices_each_type_from_core_and_ram_skus(csv_copy: Path) -> None:
    replay = Replay({
        "pageToken=page-2": fixture("gcp_skus_page2.json"),
        "skus?": fixture("gcp_skus_page1.json"),
    })  # fmt: skip
    before = {e.name: e.hourly_usd for e in catalog.types_in("gcp", "us-central1")}
    report = refresh.refresh(
        "gcp", "us-central1", fetch=replay, environ={"GCP_BILLING_API_KEY": "k"},
        path=csv_copy, today=TODAY,
    )  # fmt: skip
    assert report.not_found == []
    after = {e.name: e for e in catalog.load(csv_copy) if e.provider == "gcp"}
    for name, price in before.items():  # on-demand Americas SKUs, not Spot or Frankfurt
        assert after[name].hourly_usd == pytest.approx(price, abs=1e-6), name
        assert after[name].price_source == refresh_gcp.SOURCE
    assert all("key=k" in url for url in replay.urls) and len(replay.urls) == 2
    # The Spot Preemptible SKUs (0.009 per vCPU-hour, 0.001 per GiB-hour) price the spot columns.
    for name, e in after.items():
        assert e.spot_hourly_usd == pytest.approx(e.vcpus * 0.009 + e.memory_gib * 0.001), name
        assert (e.spot_price_source, e.spot_price_date) == (
            refresh_gcp.SPOT_SOURCE, TODAY.isoformat(),
        )  # fmt: skip
    assert after["c4a-standard-32"].spot_hourly_usd == pytest.approx(0.416)


def test_gcp_refresh_needs_an_api_key(csv_copy: Path) -> None:
    with pytest.raises(RefreshError, match="GCP_BILLING_API_KEY is not set"):
        refresh.refresh("gcp", "us-central1", fetch=Replay({}), environ={}, path=csv_copy)


def test_only_https_price_urls_are_fetched() -> None:
    with pytest.raises(RefreshError, match="non-https"):
        refresh.http_json("http://prices.azure.com/api/retail/prices")


def test_refresh_refuses_a_region_that_is_not_a_name(capsys) -> None:
    from infra.cli.catalog import main

    assert main(["refresh", "--cloud", "azure", "--region", "eastus' or 1 eq 1"]) == 2
    assert '--region "eastus\' or 1 eq 1" is not a region name' in capsys.readouterr().err


def gcp_skus() -> list[dict]:
    return fixture("gcp_skus_page1.json")["skus"] + fixture("gcp_skus_page2.json")["skus"]


def test_gcp_spot_and_on_demand_skus_never_price_each_other() -> None:
    types = catalog.types_in("gcp", "us-central1")
    skus = gcp_skus()
    spot_only = [s for s in skus if s["description"].startswith("Spot Preemptible")]
    on_demand_only = [s for s in skus if s not in spot_only]
    assert len(spot_only) == 2 and all(
        s["category"]["usageType"] == "Preemptible" for s in spot_only
    )
    on_demand = refresh_gcp.RESOURCE_SKUS, refresh_gcp.ON_DEMAND_USAGE
    spot = refresh_gcp.SPOT_RESOURCE_SKUS, refresh_gcp.SPOT_USAGE
    # Only spot SKUs: no on-demand price. Only on-demand SKUs: no spot price.
    assert refresh_gcp.type_prices(spot_only, "us-central1", types, *on_demand) == {}
    assert refresh_gcp.type_prices(on_demand_only, "us-central1", types, *spot) == {}
    # A spot SKU relabelled on-demand (or the reverse) is still not taken: usage type decides.
    relabelled = [s | {"category": s["category"] | {"usageType": "OnDemand"}} for s in spot_only]
    assert refresh_gcp.type_prices(relabelled, "us-central1", types, *spot) == {}
    both = refresh_gcp.spot_prices(skus, "us-central1", types, "2026-11-22")
    assert both["c4a-standard-64"].usd == pytest.approx(64 * 0.009 + 256 * 0.001)
    assert refresh_gcp.spot_prices(skus, "europe-west3", types, "2026-11-22") == {}


def test_azure_spot_is_the_newest_linux_spot_row() -> None:
    items = fixture("azure_retail_spot_e32ps.json")["Items"]
    # Windows Spot (0.2) and Low Priority (0.1) are dropped; of two Linux Spot rows the newest.
    assert refresh_azure.spot_price(items) == 0.33
    assert refresh_azure.on_demand_price(items) == 1.9
    spot_rows = [i for i in items if i["skuName"].endswith(" Spot")]
    on_demand_rows = [i for i in items if i not in spot_rows]
    assert refresh_azure.on_demand_price(spot_rows) is None
    assert refresh_azure.spot_price(on_demand_rows) is None


def test_azure_refresh_writes_spot_and_on_demand_to_their_own_columns(csv_copy: Path) -> None:
    spot_only = fixture("azure_retail_spot_e32ps.json")
    spot_only["Items"] = [i for i in spot_only["Items"] if i["skuName"].endswith(" Spot")]
    replay = Replay({
        "armSkuName eq 'Standard_E32ps_v6'": fixture("azure_retail_spot_e32ps.json"),
        "armSkuName eq 'Standard_E96ps_v6'": spot_only,
    })  # fmt: skip
    report = refresh.refresh("azure", "eastus", fetch=replay, path=csv_copy, today=TODAY)
    rows = {e.name: e for e in catalog.load(csv_copy) if e.provider == "azure"}
    e32 = rows["Standard_E32ps_v6"]
    assert (e32.hourly_usd, e32.spot_hourly_usd) == (1.9, 0.33)
    # Only a Spot row: the spot price is known, the on-demand one stays unknown.
    e96 = rows["Standard_E96ps_v6"]
    assert (e96.hourly_usd, e96.spot_hourly_usd) == (None, 0.33)
    assert e96.price_source == "not found in any checked source"
    assert "Standard_E96ps_v6" in report.not_found
    assert report.spot_updated == [
        ("Standard_E32ps_v6", None, 0.33),
        ("Standard_E96ps_v6", None, 0.33),
    ]
