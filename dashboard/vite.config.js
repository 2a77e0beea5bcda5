// The dashboard's build: `npm run build` writes the bundle the Python package ships and
// serve_app/routers/dashboard.py serves at /dashboard/. Relative asset URLs (base "./"), because the
// API may be mounted under a Ray Serve route prefix the build cannot know.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";

export default defineConfig({
  base: "./",
  build: {
    outDir: fileURLToPath(new URL("../serve_app/dashboard_static", import.meta.url)),
    emptyOutDir: true,
    // Chart.js alone is ~200 kB minified; one chunk keeps the server's asset list to two files.
    chunkSizeWarningLimit: 400,
  },
});
