// The operator's Tenants page (/ops/tenants): organisations' requests for models, grants, tenant-wide rate
// limits, and each organisation's status.
import { useEffect, useState, type FormEvent } from "react";
import { api, type AccessRequest } from "../api";
import { Badge, ErrorMessage, InputField, LoadedTable, Page, RowButton, SelectField, Table, fmtInt, fmtTime, stateTone, useAction, useApi, useForm } from "../components";
import type { Model, Tenant } from "./types";

function requester(who: string) {
  return who.startsWith("console:") ? who.slice("console:".length) : who;
}

function AccessRequests({ models, rev, onAnswered }: { models: Model[]; rev: number; onAnswered: () => void }) {
  // `rev` changes when the page changed grants elsewhere (a grant answers the requests it satisfies)
  const queue = useApi<{ data: AccessRequest[]; count: number }>("/ops/access-requests?state=pending", [rev]);
  const act = useAction(() => {
    queue.reload();
    onAnswered();
  });
  const [chosen, setChosen] = useState<Record<string, string>>({});
  const approve = (r: AccessRequest) => {
    const model_id = r.model_id ?? chosen[r.id];
    act.run(() => api(`/ops/access-requests/${r.id}/approve`, { method: "POST", body: r.model_id ? {} : { model_id } }));
  };
  const decline = (r: AccessRequest) => {
    const who = `“${r.tenant_display_name}” (${r.tenant_name})`;
    const reason = window.prompt(`Decline ${who}'s request for ${r.model ?? "a model"}? The organisation sees your reason (optional):`, "");
    if (reason === null) return;
    act.run(() => api(`/ops/access-requests/${r.id}/decline`, { method: "POST", body: { reason: reason.trim() || null } }));
  };
  const pending = queue.data?.data ?? [];
  return (
    <div className="card" data-testid="access-requests">
      <h2 id="requests-title">Access requests {queue.data ? <Badge tone={pending.length ? "warn" : "muted"}>{fmtInt(queue.data.count)} waiting</Badge> : null}</h2>
      <ErrorMessage error={queue.error ?? act.error} />
      {queue.data && pending.length === 0 && <p className="muted">No organisation is waiting for a model.</p>}
      {pending.length > 0 && (
        <Table aria-labelledby="requests-title" cols={["Organisation", "Asks for", "Asked"]} actions="Actions">
          {pending.map((r) => (
            <tr key={r.id}>
              <th scope="row">
                {r.tenant_display_name} <span className="muted">({r.tenant_name})</span>
                {r.note && <div className="muted">“{r.note}”</div>}
              </th>
              <td>
                {r.model ? (
                  <code>{r.model}</code>
                ) : (
                  <SelectField bare id={`approve-${r.id}`} label="Any model: grant" placeholder="Choose a model" options={models}
                    value={chosen[r.id] ?? ""} onChange={(e) => setChosen({ ...chosen, [r.id]: e.target.value })} />
                )}
              </td>
              <td>
                {fmtTime(r.requested_at)} <span className="muted">by {requester(r.requested_by)}</span>
              </td>
              <td className="actions">
                <RowButton label="Approve" target={r.tenant_name} disabled={act.busy || (!r.model_id && !chosen[r.id])} onClick={() => approve(r)} />
                <RowButton label="Decline" target={r.tenant_name} className="danger" disabled={act.busy} onClick={() => decline(r)} />
              </td>
            </tr>
          ))}
        </Table>
      )}
    </div>
  );
}

interface RateLimit {
  id: string;
  api_key_id: string | null;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  max_concurrency: number | null;
  max_tokens_per_request: number | null;
}

/** A tenant-wide limit's fields, in the order of the form (and of the body it sends). */
const LIMITS = [
  ["requests_per_minute", "Requests per minute"],
  ["tokens_per_minute", "Tokens per minute"],
  ["max_concurrency", "Requests at once"],
  ["max_tokens_per_request", "Tokens per request"],
] as const;
type LimitForm = Record<(typeof LIMITS)[number][0], string>;

function RateLimits({ tenants }: { tenants: Tenant[] }) {
  const [tenantId, setTenantId] = useState("");
  const limits = useApi<RateLimit[]>(tenantId ? `/ops/tenants/${tenantId}/rate-limits` : null, [tenantId]);
  const act = useAction(() => limits.reload());
  const current = limits.data?.find((l) => l.api_key_id === null) ?? null;
  const perKey = (limits.data ?? []).filter((l) => l.api_key_id !== null).length;
  const f = useForm<LimitForm>({ requests_per_minute: "", tokens_per_minute: "", max_concurrency: "", max_tokens_per_request: "" });
  useEffect(() => {
    const v = (n: number | null | undefined) => (n === null || n === undefined ? "" : String(n));
    f.setForm(Object.fromEntries(LIMITS.map(([k]) => [k, v(current?.[k])])) as LimitForm);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [current?.id, ...LIMITS.map(([k]) => current?.[k])]);
  const set = (e: FormEvent) => {
    e.preventDefault();
    const n = (x: string) => (x.trim() === "" ? null : Number(x));
    act.run(() => api(`/ops/tenants/${tenantId}/rate-limit`, { method: "PUT", body: Object.fromEntries(LIMITS.map(([k]) => [k, n(f.form[k])])) }));
  };
  const tenant = tenants.find((t) => t.id === tenantId);
  const remove = () => {
    if (current && tenant)
      act.confirmed(`Remove every tenant-wide limit of “${tenant.display_name}” (${tenant.name})? Its keys are then limited only by their own limits.`, () =>
        api(`/ops/tenants/${tenantId}/rate-limits/${current.id}`, { method: "DELETE" }),
      );
  };
  return (
    <form className="card form" onSubmit={set} aria-labelledby="limits-title" data-testid="rate-limits">
      <h2 id="limits-title">Rate limits</h2>
      <SelectField bare id="limit-tenant" label="Organisation" placeholder="Choose a tenant" options={tenants} value={tenantId} onChange={(e) => setTenantId(e.target.value)} />
      <div className="grid-3">
        {LIMITS.map(([k, label]) => (
          <InputField key={k} id={`limit-${k}`} label={label} type="number" min={1} step={1} placeholder="no limit" disabled={!tenantId} {...f.text(k)} />
        ))}
      </div>
      <p className="hint" data-testid="limits-now">
        {!tenantId
          ? "Limits apply to the whole organisation, on top of any limit of a key. Empty: no limit of that kind."
          : current
            ? `Now: ${current.requests_per_minute ?? "no limit on"} requests/min, ${current.tokens_per_minute ?? "no limit on"} tokens/min, ${current.max_concurrency ?? "no limit on"} at once, ${current.max_tokens_per_request ?? "no cap on"} tokens per request${perKey ? `; ${perKey} key(s) have limits of their own` : ""}.`
            : `Now: no tenant-wide limit${perKey ? `; ${perKey} key(s) have limits of their own` : ""}.`}
      </p>
      <div className="row">
        <button type="submit" disabled={act.busy || !tenantId}>
          Set limits
        </button>
        {current && (
          <button type="button" className="danger" disabled={act.busy} onClick={remove}>
            Remove limits
          </button>
        )}
      </div>
      <ErrorMessage error={act.error ?? limits.error} />
    </form>
  );
}

export function Tenants() {
  const tenants = useApi<Tenant[]>("/ops/tenants");
  const models = useApi<Model[]>("/ops/models");
  const [rev, setRev] = useState(0);
  const act = useAction(() => {
    tenants.reload();
    setRev((r) => r + 1);
  });
  const [tenantId, setTenantId] = useState("");
  const [modelId, setModelId] = useState("");
  const grant = (e: FormEvent) => {
    e.preventDefault();
    act.run(() => api(`/ops/tenants/${tenantId}/models/${modelId}`, { method: "PUT" }));
  };
  const who = (t: Tenant) => `“${t.display_name}” (${t.name})`;
  return (
    <Page title="Tenants" intro="Organisations on the platform, the models they may use, and their status.">
      <AccessRequests models={models.data ?? []} rev={rev} onAnswered={() => tenants.reload()} />
      <form className="card form" onSubmit={grant} aria-labelledby="grant-title">
        <h2 id="grant-title">Grant a model</h2>
        <div className="grid-3">
          <SelectField id="grant-tenant" label="Tenant" required placeholder="Choose a tenant" options={tenants.data} value={tenantId} onChange={(e) => setTenantId(e.target.value)} />
          <SelectField id="grant-model" label="Model" required placeholder="Choose a model" options={models.data} value={modelId} onChange={(e) => setModelId(e.target.value)} />
          <div className="align-end">
            <button type="submit" disabled={act.busy}>
              Grant
            </button>
          </div>
        </div>
        <ErrorMessage error={act.error} />
      </form>
      <RateLimits tenants={tenants.data ?? []} />
      <LoadedTable q={tenants} what="tenants" caption="Tenants" cols={["Tenant", "Status", "Models", "Users", "Created"]} actions="Actions">
        {(t) => (
          <tr key={t.id}>
            <th scope="row">
              {t.display_name} <span className="muted">({t.name})</span>
            </th>
            <td>
              <Badge tone={stateTone(t.status)}>{t.status}</Badge>
            </td>
            <td>
              {t.models.length === 0 && <Badge tone="warn">waiting for access</Badge>}
              <ul className="plain">
                {t.models.map((name) => {
                  const model = models.data?.find((m) => m.name === name);
                  return (
                    <li key={name}>
                      {name}{" "}
                      {model && (
                        <RowButton label="Revoke" target={`${name} from ${t.name}`} className="link danger" disabled={act.busy}
                          onClick={() => act.confirmed(`Revoke ${who(t)}'s access to ${name}? Its keys stop reaching the model at once.`, () => api(`/ops/tenants/${t.id}/models/${model.id}`, { method: "DELETE" }))} />
                      )}
                    </li>
                  );
                })}
              </ul>
            </td>
            <td>{fmtInt(t.users)}</td>
            <td>{fmtTime(t.created_at)}</td>
            <td className="actions">
              {t.status === "active" ? (
                <RowButton label="Suspend" target={t.name} className="danger"
                  onClick={() => act.confirmed(`Suspend ${who(t)}? Its API keys stop working at once and its users are signed out.`, () => api(`/ops/tenants/${t.id}/suspend`, { method: "POST" }))} />
              ) : (
                <RowButton label="Resume" target={t.name} className="secondary" onClick={() => act.run(() => api(`/ops/tenants/${t.id}/resume`, { method: "POST" }))} />
              )}
            </td>
          </tr>
        )}
      </LoadedTable>
    </Page>
  );
}
