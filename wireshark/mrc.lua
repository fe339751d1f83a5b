-- Wireshark dissector for OCP MRC 1.0 (Multipath Reliable Connection), as mrcstack sends it.
--
-- Use:  tshark -X lua_script:wireshark/mrc.lua -r capture.pcap
--       or copy this file to ~/.local/lib/wireshark/plugins/ (Wireshark >= 3.x) and restart.
-- It takes UDP port 4791 (RoCEv2); opcodes that are not MRC's go to Wireshark's own
-- InfiniBand dissector, so plain RoCEv2 traffic still decodes as before.
--
-- The layout is docs/wire-format.md in the mrcstack repository: BTH, the OCP headers (METH,
-- TSETH, RETH, ImmDt, SETH, CC_STATE, NETH, ERTH, EETH, PETH, AETH), mrcstack's optional
-- extension header (XETH on writes and requests, XFETH on feedback: "mrc.ext" says whether
-- a packet carries one) and the trailer.  The trailer is the RoCEv2 ICRC unless the
-- extension's AEAD_TAG flag says it is mrcstack's 16-byte AES-GCM tag, so no preference is
-- needed.  A control packet names the extension in its next header (0x1F); a write is
-- recognised by the extension's version and header check.  Trimmed writes have no trailer:
-- with the extension its TRIMMED flag says so, without it the traffic class (DSCP 12, or 16
-- when trimmed on the last hop).

local mrc = Proto("mrc", "OCP Multipath Reliable Connection")

local OPCODES = {
    [0xC6] = "RDMA_WRITE_FIRST", [0xC7] = "RDMA_WRITE_MIDDLE", [0xC8] = "RDMA_WRITE_LAST",
    [0xC9] = "RDMA_WRITE_LAST_IMM", [0xCA] = "RDMA_WRITE_ONLY", [0xCB] = "RDMA_WRITE_ONLY_IMM",
    [0xD1] = "ACKNOWLEDGE", [0xD8] = "ENDPOINT_REQUEST", [0xD9] = "ENDPOINT_RESPONSE",
    [0xDC] = "RELIABILITY_SACK", [0xDD] = "RELIABILITY_NACK", [0xDE] = "RELIABILITY_PROBE_REQ",
}
local NACK_REASONS = {
    [0x01] = "TRIMMED", [0x02] = "TRIMMED_LASTHOP", [0x06] = "NO_BITMAP",
    [0x07] = "NO_PKT_BUFFER", [0x0A] = "NO_RESOURCE", [0x0B] = "PSN_OOR_WINDOW",
    [0x19] = "UNEXP_EVENT", [0xE0] = "REMOTE_ACCESS (mrcstack)", [0xE1] = "SEQ_ERROR (mrcstack)",
    [0xE2] = "INVALID_REQUEST (mrcstack)",
}
local SKIP_HINTS = { [0] = "none", [1] = "SKIP_ONCE", [2] = "ALWAYS_SKIP" }
local ENDPOINT_OPS = { [0] = "PORT_STATUS_UPDATE", [1] = "EV_PROBE" }

local F = {}
local function field(name, abbr, kind, ...)
    F[name] = ProtoField[kind]("mrc." .. abbr, ...)
end
-- BTH
field("opcode", "bth.opcode", "uint8", "Opcode", base.HEX, OPCODES)
field("bth1", "bth.flags", "uint8", "M/SE/PadCnt/TVer", base.HEX)
field("pkey", "bth.pkey", "uint16", "P_Key", base.HEX)
field("variant", "bth.variant", "uint8", "Reserved / variant", base.HEX)
field("destqp", "bth.destqp", "uint24", "Destination QP", base.HEX)
field("ackreq", "bth.a", "uint8", "A (ack request)", base.DEC, nil, 0x80)
field("rbit", "bth.r", "uint8", "R", base.DEC, nil, 0x40)
field("rtx", "bth.rtx", "uint8", "RTX (retransmission)", base.DEC, nil, 0x20)
field("ts", "bth.ts", "uint8", "TS (TSETH present)", base.DEC, nil, 0x10)
field("psn", "bth.psn", "uint24", "PSN", base.DEC)
-- METH, TSETH, RETH, ImmDt
field("rq_msn", "meth.rq_msn", "uint16", "RQ MSN", base.DEC)
field("msn", "meth.msn", "uint16", "MSN", base.DEC)
field("tseth_ts", "tseth.tx_timestamp", "uint16", "tx_timestamp (1.024 us)", base.DEC)
field("tseth_tsr", "tseth.tsr", "uint16", "TSR", base.DEC, nil, 0x8000)
field("tseth_ftype", "tseth.ftype", "uint16", "ftype", base.DEC, nil, 0x000F)
field("va", "reth.va", "uint64", "Virtual address", base.HEX)
field("rkey", "reth.r_key", "uint32", "R_Key", base.HEX)
field("dmalen", "reth.dmalen", "uint32", "DMA length (the whole write)", base.DEC)
field("immdt", "immdt", "uint32", "Immediate", base.HEX)
-- XETH / XFETH (mrcstack)
field("x_version", "xeth.version", "uint8", "Version", base.DEC)
field("x_flags", "xeth.flags", "uint8", "Flags", base.HEX)
field("x_trimmed", "xeth.trimmed", "uint8", "TRIMMED", base.DEC, nil, 0x40)
field("x_lasthop", "xeth.trim_lasthop", "uint8", "TRIM_LASTHOP", base.DEC, nil, 0x80)
field("x_duplicate", "xfeth.duplicate", "uint8", "DUPLICATE", base.DEC, nil, 0x02)
field("x_tag", "xeth.aead_tag", "uint8", "AEAD_TAG (trailer is an AES-GCM tag)", base.DEC, nil,
    0x20)
field("x_port", "xeth.port", "uint8", "Port (plane)", base.DEC)
field("x_ev", "xeth.ev", "uint32", "EV", base.HEX)
field("x_tx_seq", "xeth.tx_seq", "uint64", "tx_seq", base.DEC)
field("x_ts_ns", "xeth.ts_ns", "uint64", "Timestamp (ns)", base.DEC)
field("x_offset", "xeth.offset", "uint32", "Offset in the write", base.DEC)
field("x_msn", "xfeth.msn", "uint32", "Writes completed (MSN)", base.DEC)
field("x_port_state", "xfeth.port_state", "uint16", "Port state", base.HEX)
field("x_hdr_check", "xeth.hdr_check", "uint32", "hdr_check", base.HEX)
-- SETH, CC_STATE
field("seth_type", "seth.type", "uint8", "Type", base.HEX, nil, 0xF0)
field("seth_next", "seth.next", "uint16", "Next header", base.HEX, nil, 0x0F80)
field("seth_m", "seth.m", "uint8", "m (skip hint)", base.DEC, SKIP_HINTS, 0x60)
field("seth_pr", "seth.pr", "uint8", "pr (answers a reliability probe)", base.DEC, nil, 0x02)
field("seth_ack_off", "seth.ack_psn_offset", "int16", "ACK PSN offset", base.DEC)
field("seth_ack_psn", "seth.ack_psn", "uint24", "ACK PSN", base.DEC)
field("seth_entropy", "seth.entropy", "uint32", "Entropy (EV)", base.HEX)
field("sctx", "seth.src_ctx", "uint16", "Source context", base.HEX)
field("dctx", "seth.dst_ctx", "uint16", "Destination context", base.HEX)
field("cack", "seth.cack_psn", "uint24", "Cumulative ACK PSN", base.DEC)
field("cc_type", "seth.cc_type", "uint8", "CC type", base.DEC, nil, 0xF0)
field("cc_ecn", "seth.ecn", "uint8", "ECN echo", base.DEC, nil, 0x01)
field("mpr", "seth.mpr", "uint8", "MPR (x128 PSNs)", base.DEC)
field("sack_off", "seth.sack_offset", "int16", "SACK offset", base.DEC)
field("sack_base", "seth.sack_base", "uint24", "SACK base PSN", base.DEC)
field("bitmap", "seth.bitmap", "uint64", "SACK bitmap", base.HEX)
field("sacked", "seth.sacked", "string", "SACKed PSNs")
field("cc_ts", "cc.ts_echo", "uint16", "tx_timestamp echo", base.DEC)
field("cc_ooo", "cc.ooo_count", "uint16", "Out-of-order count", base.DEC, nil, 0x7FFF)
field("cc_rc", "cc.rc", "uint8", "R/C", base.DEC, nil, 0x80)
field("cc_penalty", "cc.penalty", "uint8", "Receiver cwnd penalty", base.DEC, nil, 0x7F)
field("cc_bytes", "cc.received_bytes", "uint24", "Received bytes", base.DEC)
-- NETH
field("neth_type", "neth.type", "uint8", "Type", base.HEX, nil, 0xF0)
field("neth_next", "neth.next", "uint16", "Next header", base.HEX, nil, 0x0F80)
field("reason", "neth.reason", "uint8", "NACK reason", base.HEX, NACK_REASONS)
field("vendor", "neth.vendor", "uint8", "Vendor info", base.HEX)
field("neth_entropy", "neth.entropy", "uint32", "Entropy (EV)", base.HEX)
field("neth_psn", "neth.psn", "uint24", "NACK PSN", base.DEC)
field("neth_ts", "neth.tx_timestamp", "uint16", "tx_timestamp", base.DEC)
-- ERTH, EETH, PETH, AETH
field("ep_type", "ep.type", "uint8", "Type", base.HEX, nil, 0xF0)
field("ep_next", "ep.next", "uint16", "Next header", base.HEX, nil, 0x0F80)
field("ep_op", "ep.op", "uint8", "Op", base.DEC, ENDPOINT_OPS, 0x03)
field("eeth_op", "eeth.op", "uint8", "Op", base.DEC, ENDPOINT_OPS, 0x30)
field("ep_mask", "ep.port_mask", "uint32", "Port status mask", base.HEX)
field("ep_probe_id", "ep.probe_id", "uint16", "Probe id (BTH PSN[15:0])", base.DEC)
field("ep_ts", "ep.tx_timestamp", "uint16", "tx_timestamp", base.DEC)
field("probe_id", "peth.probe_id", "uint16", "Probe id", base.DEC)
field("aeth_syndrome", "aeth.syndrome", "uint8", "Syndrome", base.HEX)
field("aeth_msn", "aeth.msn", "uint24", "MSN", base.DEC)
-- payload, trailer
field("payload", "payload", "bytes", "Payload")
field("icrc", "icrc", "uint32", "ICRC (as sent, LSB first)", base.HEX)
field("tag", "aead_tag", "bytes", "AES-GCM tag (mrcstack)")
F.trimmed_pkt = ProtoField.bool("mrc.trimmed_packet", "Trimmed in flight")
F.ext = ProtoField.bool("mrc.ext", "mrcstack extension (XETH/XFETH) present")

local fields = {}
for _, f in pairs(F) do fields[#fields + 1] = f end
mrc.fields = fields

local BTH, METH, TSETH, RETH, IMMDT = 12, 4, 4, 16, 4
local XETH, XFETH, SETH, CC, NETH, ERTH, EETH, PETH = 32, 36, 28, 8, 20, 16, 36, 16
local EXT_VERSION, NEXT_EXT, TAG_FLAG, SWITCH_FLAGS = 4, 0x1F, 0x20, 0xC0
local DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP = 12, 16
local f_tclass = Field.new("ipv6.tclass")

-- CRC32 (zlib's polynomial), for the extension's header check.
local CRC_TABLE = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if bit32.band(c, 1) == 1 then c = bit32.bxor(0xEDB88320, bit32.rshift(c, 1))
        else c = bit32.rshift(c, 1) end
    end
    CRC_TABLE[i] = c
end

-- hdr_check of the header buf(0, hlen): the check field as zero, the switch's flag bits clear.
local function header_check(buf, hlen, flags_at)
    local crc = 0xFFFFFFFF
    for i = 0, hlen - 1 do
        local b = 0
        if i < hlen - 4 then
            b = buf(i, 1):uint()
            if i == flags_at then b = bit32.band(b, bit32.bnot(SWITCH_FLAGS)) end
        end
        crc = bit32.bxor(CRC_TABLE[bit32.band(bit32.bxor(crc, b), 0xFF)], bit32.rshift(crc, 8))
    end
    return bit32.bxor(crc, 0xFFFFFFFF)
end

-- The 5-bit next header of an OCP extension header at off (type 0 only).
local function next_header(buf, off)
    if buf:len() < off + 2 or buf(off, 1):uint() >= 0x10 then return -1 end
    return bit32.band(buf(off, 1):uint(), 0x0F) * 2 + bit32.rshift(buf(off + 1, 1):uint(), 7)
end

local function psn_add(base_psn, offset)
    return (base_psn + offset) % 0x1000000
end

local function add_xeth(tree, buf, off)
    local t = tree:add(mrc, buf(off, XETH), "XETH (mrcstack extension)")
    t:add(F.x_version, buf(off, 1))
    local fl = t:add(F.x_flags, buf(off + 1, 1))
    fl:add(F.x_trimmed, buf(off + 1, 1))
    fl:add(F.x_lasthop, buf(off + 1, 1))
    fl:add(F.x_tag, buf(off + 1, 1))
    t:add(F.x_port, buf(off + 2, 1))
    t:add(F.x_ev, buf(off + 4, 4))
    t:add(F.x_tx_seq, buf(off + 8, 8))
    t:add(F.x_ts_ns, buf(off + 16, 8))
    t:add(F.x_offset, buf(off + 24, 4))
    t:add(F.x_hdr_check, buf(off + 28, 4))
    return buf(off + 1, 1):uint(), buf(off + 4, 4):uint()
end

local function add_xfeth(tree, buf, off)
    local t = tree:add(mrc, buf(off, XFETH), "XFETH (mrcstack extension)")
    t:add(F.x_version, buf(off, 1))
    local fl = t:add(F.x_flags, buf(off + 1, 1))
    fl:add(F.x_duplicate, buf(off + 1, 1))
    fl:add(F.x_tag, buf(off + 1, 1))
    t:add(F.x_port, buf(off + 2, 1))
    t:add(F.x_ev, buf(off + 4, 4))
    t:add(F.x_tx_seq, buf(off + 8, 8))
    t:add(F.x_ts_ns, buf(off + 16, 8))
    t:add(F.x_msn, buf(off + 24, 4))
    t:add(F.x_port_state, buf(off + 28, 2))
    t:add(F.x_hdr_check, buf(off + 32, 4))
    return buf(off + 1, 1):uint()
end

local function add_seth(tree, buf, off)
    local t = tree:add(mrc, buf(off, SETH + CC), "SETH + CC_STATE")
    t:add(F.seth_type, buf(off, 1))
    t:add(F.seth_next, buf(off, 2))
    t:add(F.seth_m, buf(off + 1, 1))
    t:add(F.seth_pr, buf(off + 1, 1))
    local cack = buf(off + 13, 3):uint()
    local ack_off = buf(off + 2, 2):int()
    t:add(F.seth_ack_off, buf(off + 2, 2))
    t:add(F.seth_ack_psn, buf(off + 2, 2), psn_add(cack, ack_off)):set_generated()
    t:add(F.seth_entropy, buf(off + 4, 4))
    t:add(F.sctx, buf(off + 8, 2))
    t:add(F.dctx, buf(off + 10, 2))
    t:add(F.cack, buf(off + 13, 3))
    t:add(F.cc_type, buf(off + 16, 1))
    t:add(F.cc_ecn, buf(off + 16, 1))
    t:add(F.mpr, buf(off + 17, 1))
    local sack_off = buf(off + 18, 2):int()
    t:add(F.sack_off, buf(off + 18, 2))
    local base_psn = psn_add(cack, sack_off)
    t:add(F.sack_base, buf(off + 18, 2), base_psn):set_generated()
    t:add(F.bitmap, buf(off + 20, 8))
    local got = {}
    for i = 0, 63 do
        local byte = buf(off + 27 - math.floor(i / 8), 1):uint()
        if math.floor(byte / 2 ^ (i % 8)) % 2 == 1 then
            got[#got + 1] = tostring(psn_add(base_psn, i))
        end
    end
    t:add(F.sacked, buf(off + 20, 8), table.concat(got, ",")):set_generated()
    local c = off + SETH
    t:add(F.cc_ts, buf(c, 2))
    t:add(F.cc_ooo, buf(c + 2, 2))
    t:add(F.cc_rc, buf(c + 4, 1))
    t:add(F.cc_penalty, buf(c + 4, 1))
    t:add(F.cc_bytes, buf(c + 5, 3))
    local m = bit32.rshift(bit32.band(buf(off + 1, 1):uint(), 0x60), 5)
    return cack, psn_add(cack, ack_off), m, buf(off + 20, 8):uint64()
end

-- The trailer: an AES-GCM tag when the extension's flags say so, else the ICRC.
local function add_trailer(tree, buf, hlen, xflags)
    local size = buf:len()
    if xflags ~= nil and bit32.band(xflags, TAG_FLAG) ~= 0 then
        if size >= hlen + 16 then tree:add(F.tag, buf(size - 16, 16)) end
        return 16
    end
    if size >= hlen + 4 then tree:add_le(F.icrc, buf(size - 4, 4)) end
    return 4
end

-- A control packet's extension (XETH after a request, XFETH after feedback), if its next
-- header names one; returns its flags byte, or nil.
local function add_control_ext(tree, buf, off, hdr_off, is_request)
    local len = is_request and XETH or XFETH
    if next_header(buf, hdr_off) ~= NEXT_EXT or buf:len() < off + len then
        tree:add(F.ext, false):set_generated()
        return nil
    end
    tree:add(F.ext, true):set_generated()
    if is_request then
        local flags = add_xeth(tree, buf, off)
        return flags
    end
    return add_xfeth(tree, buf, off)
end

local ib_dissector = DissectorTable.get("udp.port"):get_dissector(4791)

local function add_ctx(tree, buf, off)
    tree:add(F.sctx, buf(off, 2))
    tree:add(F.dctx, buf(off + 2, 2))
end

-- A write: METH, [TSETH], RETH, [ImmDt], [XETH], payload, trailer.
local function dissect_write(tree, buf, pinfo, opcode, psn, info)
    local size = buf:len()
    local off = BTH
    local meth = tree:add(mrc, buf(off, METH), "METH")
    meth:add(F.rq_msn, buf(off, 2))
    meth:add(F.msn, buf(off + 2, 2))
    off = off + METH
    if bit32.band(buf(8, 1):uint(), 0x10) ~= 0 then
        local ts = tree:add(mrc, buf(off, TSETH), "TSETH")
        ts:add(F.tseth_ts, buf(off, 2))
        ts:add(F.tseth_tsr, buf(off + 2, 2))
        ts:add(F.tseth_ftype, buf(off + 2, 2))
        off = off + TSETH
    end
    local reth = tree:add(mrc, buf(off, RETH), "RETH")
    reth:add(F.va, buf(off, 8))
    reth:add(F.rkey, buf(off + 8, 4))
    reth:add(F.dmalen, buf(off + 12, 4))
    local dmalen = buf(off + 12, 4):uint()
    off = off + RETH
    if opcode == 0xC9 or opcode == 0xCB then
        tree:add(F.immdt, buf(off, IMMDT))
        off = off + IMMDT
    end
    info = info .. string.format(" PSN=%d len=%d", psn, dmalen)
    if bit32.band(buf(8, 1):uint(), 0x20) ~= 0 then info = info .. " RTX" end
    -- The extension: its version where it would sit, and its header check.
    local hlen = off + XETH
    local xflags = nil
    if size >= hlen and buf(off, 1):uint() == EXT_VERSION
        and header_check(buf, hlen, off + 1) == buf(hlen - 4, 4):uint() then
        tree:add(F.ext, true):set_generated()
        local ev
        xflags, ev = add_xeth(tree, buf, off)
        off = hlen
        info = info .. string.format(" EV=0x%x", ev)
        if bit32.band(xflags, 0x40) ~= 0 then
            tree:add(F.trimmed_pkt, true):set_generated()
            return info .. (bit32.band(xflags, 0x80) ~= 0 and " TRIMMED_LASTHOP" or " TRIMMED")
        end
    else
        tree:add(F.ext, false):set_generated()
        local tc = f_tclass()
        local dscp = tc ~= nil and bit32.rshift(tc.value, 2) or -1
        if dscp == DSCP_TRIMMED or dscp == DSCP_TRIMMED_LASTHOP then
            tree:add(F.trimmed_pkt, true):set_generated()
            return info .. (dscp == DSCP_TRIMMED_LASTHOP and " TRIMMED_LASTHOP" or " TRIMMED")
        end
    end
    local tlen = (xflags ~= nil and bit32.band(xflags, TAG_FLAG) ~= 0) and 16 or 4
    if size - tlen > off then tree:add(F.payload, buf(off, size - tlen - off)) end
    add_trailer(tree, buf, off, xflags)
    return info
end

function mrc.dissector(buf, pinfo, root)
    local size = buf:len()
    if size < BTH then return 0 end
    local opcode = buf(0, 1):uint()
    local name = OPCODES[opcode]
    if name == nil then
        if ib_dissector ~= nil then return ib_dissector:call(buf, pinfo, root) end
        return 0
    end
    pinfo.cols.protocol = "MRC"
    local tree = root:add(mrc, buf(), "OCP MRC 1.0, " .. name)
    local bth = tree:add(mrc, buf(0, BTH), "BTH")
    bth:add(F.opcode, buf(0, 1))
    bth:add(F.bth1, buf(1, 1))
    bth:add(F.pkey, buf(2, 2))
    bth:add(F.variant, buf(4, 1))
    bth:add(F.destqp, buf(5, 3))
    bth:add(F.ackreq, buf(8, 1))
    bth:add(F.rbit, buf(8, 1))
    bth:add(F.rtx, buf(8, 1))
    bth:add(F.ts, buf(8, 1))
    bth:add(F.psn, buf(9, 3))
    local qpn = buf(5, 3):uint()
    local psn = buf(9, 3):uint()
    local info = string.format("%s QP=0x%06x", name, qpn)
    local off = BTH

    if opcode >= 0xC6 and opcode <= 0xCB then
        info = dissect_write(tree, buf, pinfo, opcode, psn, info)
    elseif opcode == 0xDC then
        local cack, ack_psn, m, bitmap = add_seth(tree, buf, off)
        local xflags = add_control_ext(tree, buf, off + SETH + CC, off, false)
        info = info .. string.format(" cack=%d ack=%d bitmap=0x%s", cack, ack_psn, bitmap:tohex())
        if m ~= 0 then info = info .. " m=" .. (SKIP_HINTS[m] or tostring(m)) end
        add_trailer(tree, buf, off + SETH + CC, xflags)
    elseif opcode == 0xDD then
        local neth = tree:add(mrc, buf(off, NETH), "NETH")
        neth:add(F.neth_type, buf(off, 1))
        neth:add(F.neth_next, buf(off, 2))
        neth:add(F.reason, buf(off + 2, 1))
        neth:add(F.vendor, buf(off + 3, 1))
        neth:add(F.neth_entropy, buf(off + 4, 4))
        add_ctx(neth, buf, off + 8)
        neth:add(F.neth_psn, buf(off + 13, 3))
        neth:add(F.cc_type, buf(off + 16, 1))
        neth:add(F.cc_ecn, buf(off + 16, 1))
        neth:add(F.neth_ts, buf(off + 18, 2))
        local reason = buf(off + 2, 1):uint()
        info = info .. string.format(" %s PSN=%d EV=0x%x", NACK_REASONS[reason] or
            string.format("reason 0x%02x", reason), buf(off + 13, 3):uint(), buf(off + 4, 4):uint())
        local xflags = add_control_ext(tree, buf, off + NETH, off, false)
        add_trailer(tree, buf, off + NETH, xflags)
    elseif opcode == 0xD8 then
        local ep = tree:add(mrc, buf(off, ERTH), "ERTH")
        ep:add(F.ep_type, buf(off, 1))
        ep:add(F.ep_next, buf(off, 2))
        ep:add(F.ep_op, buf(off + 1, 1))
        ep:add(F.vendor, buf(off + 3, 1))
        ep:add(F.ep_mask, buf(off + 4, 4))
        ep:add(F.ep_ts, buf(off + 12, 2))
        ep:add(F.tseth_ftype, buf(off + 14, 2))
        bth:add(F.ep_probe_id, buf(10, 2))
        local op = ENDPOINT_OPS[buf(off + 1, 1):uint() % 4] or "op?"
        info = info .. string.format(" %s id=%d", op, buf(10, 2):uint())
        local xflags = add_control_ext(tree, buf, off + ERTH, off, true)
        if xflags ~= nil then
            info = info .. string.format(" EV=0x%x", buf(off + ERTH + 4, 4):uint())
        end
        add_trailer(tree, buf, off + ERTH, xflags)
    elseif opcode == 0xD9 then
        local ep = tree:add(mrc, buf(off, EETH), "EETH")
        ep:add(F.ep_type, buf(off, 1))
        ep:add(F.ep_next, buf(off, 2))
        ep:add(F.eeth_op, buf(off + 1, 1))
        ep:add(F.ep_ts, buf(off + 28, 2))
        bth:add(F.ep_probe_id, buf(10, 2))
        local op = ENDPOINT_OPS[bit32.rshift(bit32.band(buf(off + 1, 1):uint(), 0x30), 4)]
        info = info .. string.format(" %s id=%d", op or "op?", buf(10, 2):uint())
        local xflags = add_control_ext(tree, buf, off + EETH, off, false)
        add_trailer(tree, buf, off + EETH, xflags)
    elseif opcode == 0xDE then
        local peth = tree:add(mrc, buf(off, PETH), "PETH")
        peth:add(F.ep_type, buf(off, 1))
        peth:add(F.ep_next, buf(off, 2))
        peth:add(F.vendor, buf(off + 3, 1))
        peth:add(F.probe_id, buf(off + 4, 2))
        add_ctx(peth, buf, off + 8)
        peth:add(F.ep_ts, buf(off + 12, 2))
        peth:add(F.tseth_ftype, buf(off + 14, 2))
        info = info .. string.format(" id=%d", buf(off + 4, 2):uint())
        local xflags = add_control_ext(tree, buf, off + PETH, off, true)
        add_trailer(tree, buf, off + PETH, xflags)
    elseif opcode == 0xD1 then
        local aeth = tree:add(mrc, buf(off, 4), "AETH")
        aeth:add(F.aeth_syndrome, buf(off, 1))
        aeth:add(F.aeth_msn, buf(off + 1, 3))
        tree:add(F.ext, false):set_generated()
        info = info .. string.format(" PSN=%d", psn)
        add_trailer(tree, buf, off + 4, nil)
    end
    pinfo.cols.info = info
    return size
end

DissectorTable.get("udp.port"):add(4791, mrc)
