-- wrk script for bench.e2e --load wrk: POST /v1/notifications with a unique event id each.
-- Environment: BENCH_KEY (API key), BENCH_CHANNEL (email | sms), BENCH_RUN (a run id, so two
-- runs never repeat an event id). `done` prints one JSON line for bench.wrk_load.

local key = os.getenv("BENCH_KEY")
local channel = os.getenv("BENCH_CHANNEL") or "email"
local run = os.getenv("BENCH_RUN") or "run"
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  sent, refused = 0, 0
end

function request()
  sent = sent + 1
  local i = id * 100000000 + sent
  local u = i % 5000
  local body
  if channel == "sms" then
    body = string.format(
      '{"event_id":"%s-%d","user":{"id":"u-%d","email":"user%d@example.com","phone":"+14155550100"},'
        .. '"channel":"sms","template":"otp","data":{"code":"%d"}}', run, i, u, u, i)
  else
    body = string.format(
      '{"event_id":"%s-%d","user":{"id":"u-%d","email":"user%d@example.com","phone":"+14155550100"},'
        .. '"channel":"email","template":"welcome","data":{"name":"n%d"}}', run, i, u, u, i)
  end
  return wrk.format("POST", "/v1/notifications",
    {["Authorization"] = "Bearer " .. key, ["Content-Type"] = "application/json"}, body)
end

function response(status, headers, body)
  if status ~= 202 then refused = refused + 1 end
end

function done(summary, latency, requests)
  local refused_all = 0
  for _, thread in ipairs(threads) do refused_all = refused_all + (thread:get("refused") or 0) end
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"refused":%d,"errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, refused_all,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
