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

FIXTURES = Path(__file__).parent / "fixtures" / "prices"
TODAY = datetime.date(2026, 11, 22)


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def csv_copy(tmp_path: Path) -> Path:
    path = tmp_path / "instances.csv"
    shutil.copy(catalog.CATALOG_FILE, path)
    return path


def test_every_row_has_a_source_and_prices_are_dated_or_unknown() -> None:
    rows = catalog.load()
    assert {e.provider for e in rows} == {"aws", "gcp", "azure"}
    families = catalog.cpu_families()
    for e in rows:
        assert e.arch == "arm64" and e.vcpus > 0 and e.memory_gib > 0, e
        assert e.cpu_family in families, e
        assert e.price_source, e
        if e.hourly_usd is not None:
            datetime.date.fromisoformat(e.price_date)
    for key in [("aws", "us-east-1"), ("gcp", "us-central1"), ("azure", "eastus")]:
        assert catalog.types_in(*key), key


def test_catalog_prices_are_the_published_list_prices() -> None:
    """FACTS.md figures: spot checks that the CSV was not mistyped."""
    assert catalog.find("aws", "us-east-1", "c8g.16xlarge").hourly_usd == 2.55232
    assert catalog.find("aws", "us-east-1", "r8g.8xlarge").hourly_usd == 1.88512
    # C4A is priced per resource: $0.03086 per vCPU-hour and $0.00351 per GiB-hour.
    for e in catalog.types_in("gcp", "us-central1"):
        assert e.hourly_usd == pytest.approx(e.vcpus * 0.03086 + e.memory_gib * 0.00351, abs=1e-5)


def test_writing_the_catalog_back_changes_nothing(csv_copy: Path) -> None:
    refresh.write(catalog.load(csv_copy), csv_copy)
    assert csv_copy.read_text() == catalog.CATALOG_FILE.read_text()


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
    names = sorted({e.name for e in catalog.load(csv_copy) if e.provider == "aws"})
    with Stubber(client) as stubber:
        for name in names:
            if name == "c8g.16xlarge":  # a price rise, on the second page
                expect(stubber, name, {"PriceList": [], "NextToken": "more"})
                expect(stubber, name, aws_page(name, "2.6000000000"), token="more")
            elif name == "r6g.16xlarge":  # not offered: no products
                expect(stubber, name, {"PriceList": []})
            else:
                old = catalog.find("aws", "us-east-1", name)
                expect(stubber, name, aws_page(name, f"{old.hourly_usd:.10f}"))
        report = refresh.refresh("aws", "us-east-1", aws_client=client, path=csv_copy, today=TODAY)
        stubber.assert_no_pending_responses()
    assert report.updated == [("c8g.16xlarge", 2.55232, 2.6)]
    assert report.not_found == ["r6g.16xlarge"]
    rows = {e.name: e for e in catalog.load(csv_copy) if e.region == "us-east-1"}
    assert rows["c8g.16xlarge"].hourly_usd == 2.6
    assert rows["c8g.16xlarge"].price_source == refresh_aws.SOURCE
    assert rows["c8g.16xlarge"].price_date == "2026-11-22"
    assert rows["r6g.16xlarge"].price_date == "2026-07-20"  # kept, with its old date


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
        1.2345, refresh_azure.SOURCE, "2026-11-22",
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
