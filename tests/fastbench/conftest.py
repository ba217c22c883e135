import pytest


def pytest_addoption(parser):
    parser.addoption("--fastbench", required=True, help="path to the fastbench executable")


@pytest.fixture(scope="session")
def fastbench(request):
    return request.config.getoption("--fastbench")
