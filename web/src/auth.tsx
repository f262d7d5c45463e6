import { useState, type FormEvent } from "react";
import { ApiError, api, type SessionInfo } from "./api";
import { ErrorMessage, Page } from "./components";
import { Link } from "./router";

export function SignIn({ onSignedIn }: { onSignedIn: (s: SessionInfo) => void }) {
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onSignedIn(await api<SessionInfo>("/login", { method: "POST", body: { email, password } }));
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="auth">
      <Page title="Sign in to Baton" intro="Tenants and platform operators sign in here.">
        <form onSubmit={submit} className="card form" aria-describedby={error ? "signin-error" : undefined}>
          <label htmlFor="signin-email">Email</label>
          <input id="signin-email" type="email" autoComplete="username" required value={email} onChange={(e) => setEmail(e.target.value)} />
          <label htmlFor="signin-password">Password</label>
          <input id="signin-password" type="password" autoComplete="current-password" required value={password} onChange={(e) => setPassword(e.target.value)} />
          <div id="signin-error">
            <ErrorMessage error={error} title="Could not sign in" />
          </div>
          <button type="submit" disabled={busy}>
            {busy ? "Signing in…" : "Sign in"}
          </button>
          <p>
            New to Baton? <Link to="/signup">Create an organisation</Link>
          </p>
        </form>
      </Page>
    </div>
  );
}

export function SignUp({ onSignedIn }: { onSignedIn: (s: SessionInfo) => void }) {
  const [organisation, setOrganisation] = useState("");
  const [tenantName, setTenantName] = useState("");
  const [touchedSlug, setTouchedSlug] = useState(false);
  const [email, setEmail] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const [notice, setNotice] = useState<string | null>(null);
  const slugify = (s: string) =>
    s
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, "-")
      .replace(/^-+|-+$/g, "")
      .slice(0, 64);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const res = await api<SessionInfo | { status: string; detail: string }>("/signup", {
        method: "POST",
        body: { organisation, tenant_name: tenantName, email, password },
      });
      if ("status" in res && res.status === "pending_review") {
        setNotice(res.detail); // sign-ups wait for an operator: no session yet
        return;
      }
      onSignedIn(res as SessionInfo);
    } catch (err) {
      setError(err as ApiError);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div className="auth">
      <Page title="Create an organisation" intro="You become its administrator and can create API keys right away.">
        <form onSubmit={submit} className="card form">
          <label htmlFor="su-org">Organisation name</label>
          <input
            id="su-org"
            required
            maxLength={200}
            value={organisation}
            onChange={(e) => {
              setOrganisation(e.target.value);
              if (!touchedSlug) setTenantName(slugify(e.target.value));
            }}
          />
          <label htmlFor="su-slug">Tenant id</label>
          <input
            id="su-slug"
            required
            pattern="[a-z0-9][a-z0-9\-]{0,63}"
            aria-describedby="su-slug-hint"
            value={tenantName}
            onChange={(e) => {
              setTouchedSlug(true);
              setTenantName(e.target.value);
            }}
          />
          <p id="su-slug-hint" className="hint">
            Lower-case letters, digits and “-”; it identifies your organisation in usage and logs.
          </p>
          <label htmlFor="su-email">Email</label>
          <input id="su-email" type="email" autoComplete="username" required value={email} onChange={(e) => setEmail(e.target.value)} />
          <label htmlFor="su-password">Password</label>
          <input
            id="su-password"
            type="password"
            autoComplete="new-password"
            minLength={12}
            required
            aria-describedby="su-password-hint"
            value={password}
            onChange={(e) => setPassword(e.target.value)}
          />
          <p id="su-password-hint" className="hint">
            At least 12 characters, not a common password.
          </p>
          <ErrorMessage error={error} title="Could not create the organisation" />
          {notice && (
            <p role="status" className="notice" data-testid="signup-notice">
              {notice}
            </p>
          )}
          <button type="submit" disabled={busy || notice !== null}>
            {busy ? "Creating…" : "Create organisation"}
          </button>
          <p>
            Already have an account? <Link to="/login">Sign in</Link>
          </p>
        </form>
      </Page>
    </div>
  );
}
