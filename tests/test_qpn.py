"""One printed form of a QPN (``0x`` and six hex digits, as tshark prints the BTH's
destination QP), read back in either form, and the API's values showing it in their reprs."""

from __future__ import annotations

import pytest

from mrcstack.api.types import AsyncEvent, AsyncEventType, WcOpcode, WcStatus, WorkCompletion
from mrcstack.qpn import parse_qpn, qpn_text


def test_a_qpn_prints_as_tshark_prints_it_and_reads_back_in_either_form() -> None:
    assert qpn_text(0xBB2357) == "0xbb2357" and qpn_text(7) == "0x000007"
    for text in ("0xbb2357", "0XBB2357", "12264279", " 0xbb2357 "):
        assert parse_qpn(text) == 0xBB2357
    for bad, needle in (("bb2357", "not a QPN"), ("0x1000000", "out of range"), ("-1", "range")):
        with pytest.raises(ValueError, match=needle):
            parse_qpn(bad)


def test_api_values_show_their_qpn_in_hex() -> None:
    wc = WorkCompletion(1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 0xBB2357, 10)
    assert "qpn=0xbb2357" in repr(wc) and "wr_id=1" in repr(wc)
    assert "qpn=0x000005" in repr(AsyncEvent(AsyncEventType.QP_FATAL, qpn=5))
    assert "qpn=None" in repr(AsyncEvent(AsyncEventType.PORT_ERR, port=1))
