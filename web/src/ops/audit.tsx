// The operator's audit log (/ops/audit): every change to the platform's records, with who made it.
import { useState } from "react";
import { Loaded, Page, Pager, Table, fmtTime, useApi } from "../components";

interface AuditRow {
  id: number;
  at: string;
  actor: string;
  action: string;
  target_type: string;
  target_id: string | null;
  target_name: string | null;
  tenant_id: string | null;
  tenant_name: string | null;
  before: unknown;
  after: unknown;
}

const TARGET_TYPES = ["tenant", "user", "api_key", "access_request", "model", "tenant_model", "deployment", "slo_policy", "slo_assignment", "admin_token", "serve_config", "batch"];
const words = (type: string) => type.replace(/_/g, " ");

export function Audit() {
  const [offset, setOffset] = useState(0);
  const [type, setType] = useState("");
  const [by, setBy] = useState("");
  const limit = 50;
  const query = new URLSearchParams({ limit: String(limit), offset: String(offset) });
  if (type) query.set("target_type", type);
  if (by) query.set("by", by);
  const log = useApi<{ data: AuditRow[]; count: number }>(`/ops/audit?${query}`, [offset, type, by]);
  return (
    <Page
      title="Audit log"
      intro="Every change to tenants, keys, models, deployments, policies and batches, with who made it."
      actions={
        <div>
          <label htmlFor="audit-type">Show</label>{" "}
          <select id="audit-type" value={type} onChange={(e) => { setType(e.target.value); setOffset(0); }}>
            <option value="">everything</option>
            {TARGET_TYPES.map((t) => (
              <option key={t} value={t}>
                {words(t)}
              </option>
            ))}
          </select>{" "}
          <label htmlFor="audit-by">Made by</label>{" "}
          <select id="audit-by" value={by} onChange={(e) => { setBy(e.target.value); setOffset(0); }}>
            <option value="">anyone</option>
            <option value="people">people and tokens</option>
            <option value="platform">Baton itself</option>
          </select>
        </div>
      }
    >
      <Loaded q={log} what="the audit log" empty="Nothing recorded yet." isEmpty={(d) => d.count === 0}>
        {(page) => (
          <div className="card">
            <Table caption="Audit entries" cols={["When", "Who", "Action", "Target", "Change"]}>
              {page.data.map((a) => (
                <tr key={a.id}>
                  <td>{fmtTime(a.at)}</td>
                  <td>{a.actor}</td>
                  <th scope="row">{a.action}</th>
                  <td>
                    <span className="muted">{words(a.target_type)}</span>{" "}
                    {a.target_name ? <strong title={a.target_id ?? undefined}>{a.target_name}</strong>
                      : <code className="small" title={a.target_id ?? undefined}>{a.target_id?.slice(0, 8)}</code>}
                    {a.tenant_name && a.target_type !== "tenant" && <span className="muted"> · tenant {a.tenant_name}</span>}
                  </td>
                  <td>
                    {(a.before !== null || a.after !== null) && (
                      <details>
                        <summary>Show</summary>
                        <pre className="small">{JSON.stringify({ before: a.before, after: a.after }, null, 2)}</pre>
                      </details>
                    )}
                  </td>
                </tr>
              ))}
            </Table>
            <Pager label="Pages of the audit log" offset={offset} limit={limit} count={page.count} onChange={setOffset} />
          </div>
        )}
      </Loaded>
    </Page>
  );
}
