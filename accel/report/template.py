"""The report's two templates (jinja2): the HTML page, readable in a narrow window and in print,
and its Markdown twin. Kept as strings so that the page needs no package data."""

HTML = """{%- macro table(t) %}<div class="scroll"><table>
{% if t.caption %}<caption>{{ t.caption }}</caption>{% endif %}
<thead><tr>{% for h in t.head %}<th scope="col">{{ h }}</th>{% endfor %}</tr></thead>
<tbody>
{% for row in t.rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table></div>
{% endmacro -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ page.title }}</title>
<style>
:root { --ink: #1a1a1a; --muted: #555; --rule: #d0d0d0; --code: #f4f4f4; --accent: #1f5fa8; }
* { box-sizing: border-box; }
body { font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       margin: 0 auto; padding: 1rem; max-width: 64rem; }
h1 { font-size: 1.6rem; margin: 0.5rem 0 0.2rem; }
h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid var(--rule); }
h3 { font-size: 1rem; margin: 1rem 0 0.3rem; }
.subtitle, .source, figcaption, caption { color: var(--muted); font-size: 0.9rem; }
nav ol { columns: 2 14rem; padding-left: 1.2rem; font-size: 0.95rem; }
a { color: var(--accent); overflow-wrap: anywhere; }
dl { display: grid; grid-template-columns: minmax(8rem, max-content) 1fr; gap: 0.2rem 1rem; }
dt { font-weight: 600; }
dd { margin: 0; overflow-wrap: anywhere; }
pre, code { font: 0.85rem/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: var(--code); padding: 0.6rem; overflow-x: auto; white-space: pre-wrap;
      overflow-wrap: anywhere; }
.scroll { overflow-x: auto; margin: 0.5rem 0; }
table { border-collapse: collapse; font-size: 0.85rem; }
caption { text-align: left; padding-bottom: 0.2rem; }
th, td { border: 1px solid var(--rule); padding: 0.2rem 0.5rem; text-align: left;
         vertical-align: top; }
th { background: var(--code); }
figure { margin: 1rem 0; }
.plot { width: 100%; min-height: 300px; }
@media (max-width: 40rem) {
  body { padding: 0.5rem; font-size: 15px; }
  dl { grid-template-columns: 1fr; }
  dt { margin-top: 0.4rem; }
}
@media print {
  body { max-width: none; font-size: 11pt; }
  nav { display: none; }
  h2 { break-after: avoid; }
  figure, table, pre { break-inside: avoid; }
  .modebar-container { display: none !important; }
  a { color: inherit; }
}
</style>
<script>{{ plotly_js | safe }}</script>
</head>
<body>
<header>
<h1>{{ page.title }}</h1>
<p class="subtitle">{{ page.subtitle }}</p>
<p class="source">Written {{ generated }} from {{ page.source }}.</p>
</header>
<nav aria-label="sections"><ol>
{% for s, _ in sections %}<li><a href="#{{ s.key }}">{{ s.title }}</a></li>
{% endfor %}</ol></nav>
<main>
{% for s, figures in sections %}
<section id="{{ s.key }}">
<h2>{{ s.title }}</h2>
{% for p in s.text %}<p>{{ p }}</p>
{% endfor %}
{% if s.facts %}<dl>
{% for term, value in s.facts %}<dt>{{ term }}</dt><dd>{{ value }}</dd>
{% endfor %}</dl>{% endif %}
{% for label, url in s.links %}<p><a href="{{ url }}">{{ label }}</a></p>
{% endfor %}
{% for what, line in s.commands %}<h3>{{ what }}</h3>
<pre class="command"><code>{{ line }}</code></pre>
{% endfor %}
{% for t in s.tables %}{{ table(t) }}{% endfor %}
{% for f, html in figures %}<figure>
<div class="plot">{{ html | safe }}</div>
<figcaption>{{ f.title }}</figcaption>
<details open><summary>The numbers of this figure</summary>{{ table(f.table) }}</details>
</figure>
{% endfor %}
{% for title, text in s.blocks %}<details><summary>{{ title }}</summary>
<pre>{{ text }}</pre></details>
{% endfor %}
</section>
{% endfor %}
</main>
</body>
</html>
"""

MARKDOWN = """{%- macro table(t) %}
{% if t.caption %}{{ t.caption }}

{% endif %}| {{ t.head | map("md") | join(" | ") }} |
|{% for h in t.head %}---|{% endfor %}
{% for row in t.rows %}| {{ row | map("md") | join(" | ") }} |
{% endfor %}{% endmacro -%}
# {{ page.title }}

{{ page.subtitle }}

Written {{ generated }} from {{ page.source }}.
{% for s in page.sections %}

## {{ s.title }}
{% for p in s.text %}
{{ p }}
{% endfor %}
{% if s.facts %}
{% for term, value in s.facts %}- **{{ term }}**: {{ value }}
{% endfor %}{% endif %}
{% for label, url in s.links %}
[{{ label }}]({{ url }})
{% endfor %}
{% for what, line in s.commands %}
{{ what }}:

```
{{ line }}
```
{% endfor %}
{% for t in s.tables %}{{ table(t) }}{% endfor %}
{% for f in s.figures %}
*Figure: {{ f.title }}* (drawn in report.html)
{{ table(f.table) }}{% endfor %}
{% for title, text in s.blocks %}
<details><summary>{{ title }}</summary>

```
{{ text }}
```

</details>
{% endfor %}{% endfor %}
"""
