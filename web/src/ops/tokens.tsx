// The operator's Admin tokens page (/ops/tokens): bearer tokens for the admin REST API (/admin/v1).
import { useState, type FormEvent } from "react";
import { api } from "../api";
import { Badge, ErrorMessage, InputField, LoadedTable, Page, RowButton, SecretOnce, fmtTime, useAction, useApi } from "../components";

interface AdminToken {
  id: string;
  name: string;
  prefix: string;
  created_at: string;
  revoked_at: string | null;
}

export function AdminTokens() {
  const tokens = useApi<AdminToken[]>("/ops/admin-tokens");
  const act = useAction(() => tokens.reload());
  const [name, setName] = useState("");
  const [issued, setIssued] = useState<{ name: string; secret: string } | null>(null);
  const create = (e: FormEvent) => {
    e.preventDefault();
    act.run(async () => {
      const r = await api<{ token: AdminToken; secret: string }>("/ops/admin-tokens", { method: "POST", body: { name } });
      setIssued({ name: r.token.name, secret: r.secret });
      setName("");
    });
  };
  return (
    <Page title="Admin tokens" intro="Bearer tokens for the admin REST API (/admin/v1): for automation and scripts. Baton keeps only their hashes.">
      <ErrorMessage error={tokens.error ?? act.error} />
      {issued && (
        <SecretOnce id="token-secret" title={`Your new admin token “${issued.name}”`} label="Admin token" copyLabel="Copy token"
          secret={issued.secret} onDone={() => setIssued(null)}>
          Copy it now: Baton shows it <strong>only once</strong>. It can do everything an operator can.
        </SecretOnce>
      )}
      <form className="card form" onSubmit={create} aria-labelledby="token-title">
        <h2 id="token-title">New admin token</h2>
        <InputField bare id="token-name" label="Name" required maxLength={100} placeholder="e.g. deploy pipeline" value={name} onChange={(e) => setName(e.target.value)} />
        <button type="submit" disabled={act.busy}>
          Create token
        </button>
      </form>
      <LoadedTable q={tokens} what="the admin tokens" empty="No admin tokens yet." showError={false} aria-label="Admin tokens" cols={["Name", "Token", "Created", "State"]} actions="Actions">
        {(t) => (
          <tr key={t.id}>
            <th scope="row">{t.name}</th>
            <td>
              <code>{t.prefix}…</code>
            </td>
            <td>{fmtTime(t.created_at)}</td>
            <td>{t.revoked_at ? <Badge tone="bad">revoked {fmtTime(t.revoked_at)}</Badge> : <Badge tone="ok">active</Badge>}</td>
            <td className="actions">
              {!t.revoked_at && (
                <RowButton label="Revoke" target={t.name} className="danger" disabled={act.busy}
                  onClick={() => act.confirmed(`Revoke the admin token “${t.name}”? Anything using it is refused at once.`, () => api(`/ops/admin-tokens/${t.id}`, { method: "DELETE" }))} />
              )}
            </td>
          </tr>
        )}
      </LoadedTable>
    </Page>
  );
}
