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
from botocore.stub import Stubber

from infra import catalog
from infra.catalog import refresh
from infra.catalog.refresh import RefreshError
from infra.catalog.refresh import aws as refresh_aws
from infra.catalog.refresh import azure as refresh_azure
from infra.catalog.refresh import gcp as refresh_gcp
from infra.planner import perf
from tests.conftest import CATALOG_FIXTURE
from tests.pulumi_mocks import program_settings, stack_names

FIXTURES = Path(__file__).parent / "fixtures" / "prices"
TODAY = datetime.date(2026, 11, 22)
# The product's own CSVs, read by path: the session reads the fixture catalog.
PRODUCT_CSVS = {
    "instances": catalog.CATALOG_FILE,
    "cpus": catalog.CPUS_FILE,
    "services": catalog.SERVICES_FILE,
}
FIXTURE_CSVS = {
    "instances": CATALOG_FIXTURE / catalog.INSTANCES_NAME,
    "cpus": CATALOG_FIXTURE / catalog.CPUS_NAME,
    "services": CATALOG_FIXTURE / catalog.SERVICES_NAME,
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
    """C4A is priced per resource: two types fix the vCPU and GiB prices, the rest follow."""
    rows = [
        e for e in catalog.load(PRODUCT_CSVS["instances"]) if e.provider == "gcp" and e.hourly_usd
    ]
    by_name = {e.name: e for e in rows}
    low, high = by_name["c4a-standard-32"], by_name["c4a-highmem-32"]  # same vCPUs, more GiB
    assert low.vcpus == high.vcpus and low.hourly_usd and high.hourly_usd
    per_gib = (high.hourly_usd - low.hourly_usd) / (high.memory_gib - low.memory_gib)
    per_vcpu = (low.hourly_usd - per_gib * low.memory_gib) / low.vcpus
    assert per_vcpu > 0 and per_gib > 0
    for e in rows:
        assert e.hourly_usd == pytest.approx(e.vcpus * per_vcpu + e.memory_gib * per_gib, abs=5e-5)


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


def test_the_catalog_directory_is_read_at_each_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (catalog.INSTANCES_NAME, catalog.CPUS_NAME, catalog.SERVICES_NAME):
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
    client = pricing_client()
    before = {e.name: e for e in catalog.load(csv_copy) if e.region == "us-east-1"}
    risen = round((before["c8g.16xlarge"].hourly_usd or 0) + 0.1, 5)
    with Stubber(client) as stubber:
        for name in sorted(e.name for e in before.values() if e.provider == "aws"):
            if name == "c8g.16xlarge":  # a price rise, on the second page
                expect(stubber, name, {"PriceList": [], "NextToken": "more"})
                expect(stubber, name, aws_page(name, f"{risen:.10f}"), token="more")
            elif name == "r6g.16xlarge":  # not offered: no products
                expect(stubber, name, {"PriceList": []})
            else:
                expect(stubber, name, aws_page(name, f"{before[name].hourly_usd:.10f}"))
        report = refresh.refresh("aws", "us-east-1", aws_client=client, path=csv_copy, today=TODAY)
        stubber.assert_no_pending_responses()
    assert report.updated == [("c8g.16xlarge", before["c8g.16xlarge"].hourly_usd, risen)]
    assert report.not_found == ["r6g.16xlarge"]
    rows = {e.name: e for e in catalog.load(csv_copy) if e.region == "us-east-1"}
    assert rows["c8g.16xlarge"].hourly_usd == risen
    assert rows["c8g.16xlarge"].price_source == refresh_aws.SOURCE
    assert rows["c8g.16xlarge"].price_date == TODAY.isoformat()
    assert rows["r6g.16xlarge"] == before["r6g.16xlarge"]  # kept, with its old price and date
    assert rows["c8g.8xlarge"].price_date == TODAY.isoformat()  # same price, newly checked


def test_aws_refresh_of_a_new_region_adds_rows_with_the_known_specs(csv_copy: Path) -> None:
    client = pricing_client()
    with Stubber(client) as stubber:
        for name in sorted({e.name for e in catalog.load(csv_copy) if e.provider == "aws"}):
            params = {
                "ServiceCode": "AmazonEC2",
                "Filters": refresh_aws.filters("eu-west-1", name),
                "MaxResults": 100,
            }
            response = (
                aws_page(name, "3.0000000000") if name == "r8g.8xlarge" else {"PriceList": []}
            )
            stubber.add_response("get_products", response, params)
        report = refresh.refresh("aws", "eu-west-1", aws_client=client, path=csv_copy, today=TODAY)
    assert report.added == [("r8g.8xlarge", 3.0)]
    [row] = [e for e in catalog.load(csv_copy) if e.region == "eu-west-1"]
    assert (row.vcpus, row.memory_gib, row.cpu_family) == (32, 256, "graviton4")


def test_two_different_aws_prices_for_one_type_are_an_error() -> None:
    client = pricing_client()
    page = aws_page("c8g.16xlarge", "2.5")
    page["PriceList"].append(aws_page("c8g.16xlarge", "2.7")["PriceList"][0])
    with Stubber(client) as stubber:
        expect(stubber, "c8g.16xlarge", page)
        with pytest.raises(RefreshError, match=r"several on-demand prices for c8g\.16xlarge"):
            refresh_aws.aws_prices(client, "us-east-1", ["c8g.16xlarge"])


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


def test_gcp_refresh_needs_an_api_key(csv_copy: Path) -> None:
    with pytest.raises(RefreshError, match="GCP_BILLING_API_KEY is not set"):
        refresh.refresh("gcp", "us-central1", fetch=Replay({}), environ={}, path=csv_copy)


def test_only_https_price_urls_are_fetched() -> None:
    with pytest.raises(RefreshError, match="non-https"):
        refresh.http_json("http://prices.azure.com/api/retail/prices")


def test_refresh_refuses_a_region_that_is_not_a_name(capsys) -> None:
    from infra.catalog.__main__ import main

    assert main(["refresh", "--provider", "azure", "--region", "eastus' or 1 eq 1"]) == 2
    assert '--region "eastus\' or 1 eq 1" is not a region name' in capsys.readouterr().err
