-- The wrk script of bench/run: the request comes from the environment
-- (WRK_METHOD, default GET; WRK_BODY_SIZE bytes of "a" as the body when
-- set; WRK_CLOSE set: "Connection: close", so that every request has a
-- connection of its own), and done() prints one line "JSON {...}" with the counts and the
-- latency percentiles (microseconds) for bench/run to read.
local method = os.getenv("WRK_METHOD") or "GET"
local size = tonumber(os.getenv("WRK_BODY_SIZE") or "")
wrk.method = method
if os.getenv("WRK_CLOSE") then
  wrk.headers["Connection"] = "close"
end
if size then
  wrk.body = string.rep("a", size)
  wrk.headers["Content-Type"] = "application/octet-stream"
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
