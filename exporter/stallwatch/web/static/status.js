// stallwatch status page: draws the last hour's plots from the page's own data (#history) and refreshes the
// report in place. Each canvas records what it drew (data-points, data-drawn pixels) for the browser test.
"use strict";

const COLORS = { memory: "#1f77b4", utilization: "#d62728", log: "#2ca02c" };

function painted(ctx, width, height) {
  const pixels = ctx.getImageData(0, 0, width, height).data;
  let count = 0;
  for (let i = 3; i < pixels.length; i += 4) {
    if (pixels[i] > 0) count++;
  }
  return count;
}

function label(value) {
  return value >= 100 ? value.toFixed(0) : value.toPrecision(2);
}

function draw(canvas, history) {
  const ctx = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height;
  const left = 40, right = 8, top = 8, bottom = 18;
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  const values = history[canvas.dataset.series] || [];
  const known = values.filter((v) => v !== null);
  const ceiling = Math.max(Number(canvas.dataset.top) || 1, ...known);
  ctx.clearRect(0, 0, width, height);
  ctx.strokeStyle = "#bbb";
  ctx.lineWidth = 1;
  ctx.strokeRect(left + 0.5, top + 0.5, plotWidth, plotHeight);
  ctx.fillStyle = "#555";
  ctx.font = "10px sans-serif";
  ctx.fillText(label(ceiling), 2, top + 8);
  ctx.fillText("0", 2, height - bottom);
  ctx.fillText("-60 min", left, height - 4);
  ctx.fillText("now", width - right - 20, height - 4);
  const before = painted(ctx, width, height);

  const x = (seconds) => left + plotWidth * (1 + seconds / history.span);
  const y = (value) => top + plotHeight * (1 - value / ceiling);
  const color = COLORS[canvas.dataset.series] || "#333";
  ctx.strokeStyle = color;
  ctx.fillStyle = color;
  ctx.lineWidth = 2;
  ctx.beginPath();
  let pen = false, points = 0;
  history.t.forEach((seconds, i) => {
    const value = values[i];
    if (value === null || value === undefined) {
      pen = false;
      return;
    }
    if (pen) ctx.lineTo(x(seconds), y(value));
    else ctx.moveTo(x(seconds), y(value));
    ctx.fillRect(x(seconds) - 1.5, y(value) - 1.5, 3, 3); // a lone point shows too
    pen = true;
    points++;
  });
  ctx.stroke();
  canvas.dataset.points = String(points);
  canvas.dataset.drawn = String(painted(ctx, width, height) - before);
}

function drawAll() {
  const history = JSON.parse(document.getElementById("history").textContent);
  document.querySelectorAll("canvas.plot").forEach((canvas) => draw(canvas, history));
}

async function refresh() {
  try {
    // From the origin: a page opened as http://user:password@host/... resolves even relative URLs with the
    // credentials, which fetch() refuses; the browser's auth cache sends them.
    const response = await fetch(location.origin + location.pathname + location.search, { cache: "no-store" });
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("report");
    if (fresh === null) return;
    document.getElementById("report").replaceWith(document.adoptNode(fresh));
    drawAll();
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    // Keep the last report; the next tick tries again.
  }
}

drawAll();
setInterval(refresh, 1000 * (Number(document.body.dataset.refresh) || 15));
