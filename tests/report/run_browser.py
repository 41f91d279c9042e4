"""CTest's entry to the browser test: runs pytest on tests/report, or says SKIPPED (which CTest
reports as a skip) when pytest or chromium is missing. Arguments go to pytest."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import pytest
except ImportError:
    print("SKIPPED: pytest not installed (Debian's python3-pytest; scripts/setup.sh installs it)")
    sys.exit(0)
import cdp

if not cdp.find_chromium():
    print("SKIPPED: chromium not installed: the report's browser test needs Debian's chromium "
          "(scripts/setup.sh installs it)")
    sys.exit(0)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_report_browser.py")] + sys.argv[1:]))
