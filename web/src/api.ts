// The console's JSON API client: same-origin cookies, the session's CSRF token on every mutation,
// and errors turned into words (RFC 9457 problem details carry `detail`).

export class ApiError extends Error {
  status: number;
  param?: string;
  constructor(status: number, message: string, param?: string) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

let csrfToken = "";
export function setCsrf(token: string) {
  csrfToken = token;
}

const BASE = "/console/api";

async function errorOf(res: Response): Promise<ApiError> {
  let message = `The server answered ${res.status} ${res.statusText}.`;
  let param: string | undefined;
  try {
    const body = await res.json();
    if (body && typeof body.detail === "string") message = body.detail;
    else if (body?.error?.message) message = body.error.message;
    if (body && typeof body.param === "string") param = body.param;
  } catch {
    /* not JSON: keep the status line */
  }
  if (res.status === 401 && !message) message = "Sign in to continue.";
  return new ApiError(res.status, message, param);
}

export async function api<T>(path: string, init: { method?: string; body?: unknown } = {}): Promise<T> {
  const method = init.method ?? "GET";
  const headers: Record<string, string> = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken;
  if (init.body !== undefined) headers["Content-Type"] = "application/json";
  let res: Response;
  try {
    res = await fetch(BASE + path, {
      method,
      headers,
      credentials: "same-origin",
      body: init.body !== undefined ? JSON.stringify(init.body) : undefined,
    });
  } catch {
    throw new ApiError(0, "The console could not reach the server. Check your connection and try again.");
  }
  if (!res.ok) throw await errorOf(res);
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

export interface SessionInfo {
  user: { id: string; email: string; role: "tenant_admin" | "tenant_member" | "operator" };
  tenant: { id: string; name: string; display_name: string } | null;
  csrf_token: string;
}

export interface ApiKey {
  id: string;
  name: string;
  prefix: string;
  model_scope: string[];
  expires_at: string | null;
  revoked_at: string | null;
  rotated_to_id: string | null;
  created_at: string;
  last_used_at: string | null;
  state: "active" | "expiring" | "expired" | "revoked";
}

export interface IssuedKey {
  key: ApiKey;
  secret: string;
}

export interface TenantModel {
  id: string;
  name: string;
  context_length: number;
  dtype: string;
  params_b: number | null;
  available: boolean;
  slo: { name: string; ttft_ms: number; tpot_ms: number } | null;
}

export interface UsagePoint {
  t: string;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number;
}

export interface Usage {
  bucket: "hour" | "day";
  series: UsagePoint[];
  totals: { requests: number; prompt_tokens: number; completion_tokens: number; cached_tokens: number };
  by_model: { model: string; requests: number; prompt_tokens: number; completion_tokens: number }[];
}

export interface Pcts {
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

export interface SloModel {
  model: string;
  requests: number;
  completed: number;
  ttft_ms: Pcts;
  tpot_ms: Pcts;
  policy: { name: string; ttft_ms: number; tpot_ms: number; percentile: number } | null;
  good: number | null;
  attainment: number | null;
  goodput_rps: number | null;
}

export interface RequestRow {
  id: string;
  model: string;
  deployment: string | null;
  status: string;
  http_status: number;
  error_code: string | null;
  prompt_tokens: number;
  completion_tokens: number;
  ttft_ms: number | null;
  tpot_ms: number | null;
  e2e_ms: number;
  kv_bytes: number | null;
  handoff_ms: number | null;
  recovery_steps: number;
  trace_id: string | null;
  started_at: string;
  stream: boolean;
  /** The wait in the gateway's flow-control queue (null: flow control off, or an older record). */
  queue_ms: number | null;
  /** The SLO class the request was queued as (its policy's name, `default` without one). */
  flow_class: string | null;
}

export interface Span {
  name: string;
  kind: string;
  start_ms: number;
  duration_ms: number;
  detail: string;
}

export interface RequestDetail extends RequestRow {
  itl_p50_ms: number | null;
  itl_p99_ms: number | null;
  finished_at: string;
  recovery: Record<string, unknown>[];
  waterfall: Span[];
}

export interface AccessRequest {
  id: string;
  tenant_id: string;
  tenant_name: string | null;
  tenant_display_name: string | null;
  model_id: string | null;
  model: string | null;
  note: string | null;
  state: "pending" | "approved" | "declined";
  requested_by: string;
  requested_at: string;
  resolved_at: string | null;
  resolved_by: string | null;
  reason: string | null;
}

export interface CatalogueModel {
  id: string;
  name: string;
  context_length: number;
  dtype: string;
  params_b: number | null;
  granted: boolean;
  requested: boolean;
}

// --- batches ------------------------------------------------------------------------------------

/** A batch of the Batch API, in OpenAI's ``Batch`` shape (times in Unix seconds). */
export interface Batch {
  id: string;
  endpoint: string;
  model: string;
  status: "validating" | "in_progress" | "finalizing" | "completed" | "failed" | "expired" | "cancelling" | "cancelled";
  input_file_id: string;
  output_file_id: string | null;
  error_file_id: string | null;
  created_at: number;
  expires_at: number | null;
  completed_at: number | null;
  cancelled_at: number | null;
  request_counts: { total: number; completed: number; failed: number };
  errors: { data: { code?: string; message?: string; line?: number | null }[] } | null;
}

/** A page of batches, newest first (``/tenant/batches``). */
export interface BatchList {
  data: Batch[];
  first_id: string | null;
  last_id: string | null;
  has_more: boolean;
}

// --- flow control -------------------------------------------------------------------------------

/** One tenant's traffic on one model, all gateway processes together (``/ops/flow``). */
export interface FlowTenant {
  tenant_id: string;
  tenant_name: string | null;
  display_name: string | null;
  running: number;
  waiting: number;
  prompt_tokens: number;
  completion_tokens: number;
  queued_s: number;
  rejected: Record<string, number>;
  token_share: number | null;
}

export interface FlowProcess {
  process: string;
  limit: number | null;
  part: number | null;
  running: number;
  waiting: number;
  dispatch_per_s: number | null;
  upstream_ttft_s: number | null;
  gradient: number | null;
  tpot_floor_s: number | null;
  tpot_s: number | null;
  engine_pressure: string | null;
}

/** One engine of a model, as its latest load report says. */
export interface FlowEngine {
  engine: string;
  role: string;
  running: number;
  waiting: number;
  kv_usage: number;
  age_s: number;
}

export interface FlowModel {
  model: string;
  limit: number | null;
  running: number;
  waiting: number;
  bands: { priority: number; waiting: number }[];
  dispatch_per_s: number | null;
  rejected: Record<string, number>;
  tenants: FlowTenant[];
  processes: FlowProcess[];
  engines: FlowEngine[];
}

export interface FlowOverview {
  processes: string[];
  models: FlowModel[];
}

export interface QueuePcts {
  p50: number | null;
  p99: number | null;
}

/** A tenant's requests under flow control, per model (``/tenant/flow``). */
export interface FlowLevel {
  model: string;
  requests: number;
  queued: number;
  queue_ms: QueuePcts;
  refused: number;
  unavailable: number;
  policy: { name: string; ttft_ms: number } | null;
  ttft_met: number | null;
  ttft_attainment: number | null;
  classes: { flow_class: string | null; requests: number; queued: number; queue_ms: QueuePcts; refused: number; unavailable: number }[];
}
