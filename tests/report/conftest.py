import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def pytest_addoption(parser):
    parser.addoption("--kvsim", default=os.environ.get("KVSIM_BINARY", "build/bin/kvsim"),
                     help="the kvsim program whose reports are tested")
    parser.addoption("--screenshots", default=os.environ.get("KVSIM_REPORT_SCREENSHOTS", "build/report-screenshots"),
                     help="folder for one screenshot per page")
