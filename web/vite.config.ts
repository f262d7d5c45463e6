import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// Served by Baton's API process at /console/ (api/console/static.py); `npm run dev` proxies the API.
export default defineConfig({
  base: "/console/",
  plugins: [react()],
  build: { outDir: "dist", sourcemap: false, chunkSizeWarningLimit: 600 },
  server: {
    proxy: {
      "/console/api": "http://127.0.0.1:8000",
      "/v1": "http://127.0.0.1:8000",
    },
  },
});
