// The operator API's records that more than one operator page shows (/console/api/ops/...).

export interface Tenant {
  id: string;
  name: string;
  display_name: string;
  status: string;
  created_at: string;
  models: string[];
  users: number;
  pending_request_id: string | null;
}

export interface Model {
  id: string;
  name: string;
  source: string;
  context_length: number;
  num_layers: number;
  num_kv_heads: number;
  head_dim: number;
  dtype: string;
  params_b: number | null;
  kind: string;
  tool_call_parser: string | null;
  reasoning_parser: string | null;
  chat_template: string | null;
}

export interface Deployment {
  id: string;
  name: string;
  model: string | null;
  model_id: string;
  mode: "aggregated" | "pd";
  prefill: { min: number; max: number };
  decode: { min: number; max: number };
  kv_connector: string | null;
  slo_policy_id: string | null;
  desired_state: string;
  observed_state: string;
  observed_reason: string | null;
  observed_at: string | null;
  generation: number;
  observed_generation: number;
}

export interface Policy {
  id: string;
  name: string;
  ttft_ms: number;
  tpot_ms: number;
  percentile: number;
  priority: number;
  sheddable: boolean;
  weight: number;
  max_wait_s: number | null;
  max_waiting: number | null;
}

export interface Assignment {
  id: string;
  policy_id: string;
  tenant_id: string | null;
  model_id: string | null;
}
