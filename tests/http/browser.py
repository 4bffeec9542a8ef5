"""The order form of examples/http_shop in a real browser: Post/Redirect/Get, end to end.

Headless Chromium (Debian's package) driven by selenium through Debian's chromedriver:
fill the form, submit, land on /operations/{key}; reload that page five times; go back to
the form and submit the same values again: the same operation, and the ledger holds exactly
one order. Then a different cart makes a second order, so the count is not vacuous. A
screenshot of the result page is saved as OUT/operation.png.

Then approval: submit the refund form (`refund_order` needs a person's approval), land on
the operation page awaiting approval, with the arguments and the Approve and Deny forms;
type a name and click Approve: the page shows the refund, who approved it, when and
through which channel; reload it, go back and send the refund form again: the same
refund, and the ledger holds exactly one (screenshot OUT/approval.png).

Usage: browser.py HTTP_SHOP_BINARY OUT_DIR   (tests/http/browser.sh sets it up and runs it)
Prints "ok: ..." per check and ends with "browser: N passed, 0 failed"; on a failure it
prints the server's log, saves OUT/failure.png and exits 1.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OPERATION_PATH = re.compile(r"^/operations/[0-9a-f]{64}$")
# What the test types into the form (the note holds characters HTML must escape).
FIRST = {"user_id": "7", "cart.id": "cart-browser-1", "sku": "coffee-beans", "qty": "2",
         "note": 'leave at the door <b>fragile</b> & "ring twice"'}
SECOND = dict(FIRST, **{"cart.id": "cart-browser-2", "sku": "tea-leaves", "qty": "1"})

# The ledger is read outside the browser (its history stays the user's), never via a proxy.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

passed = 0


class Failed(Exception):
    """A check that did not hold."""


def check(condition, what):
    """Counts `what` as passed, or fails the test naming it."""
    global passed
    if not condition:
        raise Failed(what)
    passed += 1
    print(f"ok: {what}", flush=True)


def start_server(binary, work):
    """Starts http_shop on a free loopback port with a fresh SQLite file; (process, base, log)."""
    log_path = f"{work}/http_shop.log"
    log = open(log_path, "w")
    process = subprocess.Popen(
        [binary, "--addr", "127.0.0.1:0", "--db", f"{work}/shop.db"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(log_path) as f:
            found = re.search(r"listening on (http://[0-9.:]+)", f.read())
        if found:
            return process, found.group(1), log_path
        if process.poll() is not None:
            raise Failed(f"http_shop exited at start ({process.returncode})")
        time.sleep(0.05)
    raise Failed("http_shop did not say where it listens within 15 s")


def start_browser(work):
    """Headless Chromium through the system chromedriver, with a fresh profile under `work`.
    Background networking is off: the only traffic is to the shop on 127.0.0.1."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                f"--user-data-dir={work}/profile", "--window-size=1024,900",
                "--no-first-run", "--no-default-browser-check", "--disable-sync",
                "--disable-background-networking", "--disable-component-update",
                "--disable-default-apps", "--no-proxy-server", "--lang=en-US"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=f"{work}/chromedriver.log"),
                              options=options)
    driver.set_page_load_timeout(20)
    return driver


def orders(base):
    """The `order` effects in the shop's ledger."""
    with DIRECT.open(f"{base}/ledger", timeout=10) as response:
        return [e for e in json.load(response) if e.get("effect") == "order"]


def path_of(driver):
    return urlsplit(driver.current_url).path


def wait_for_path(driver, matches, what):
    """Waits until the browser shows a fully loaded page whose path `matches`."""
    try:
        WebDriverWait(driver, 15).until(
            lambda d: matches(path_of(d))
            and d.execute_script("return document.readyState") == "complete")
    except Exception as e:
        raise Failed(f"{what}: the browser is on {driver.current_url} ({type(e).__name__})")


def fill_and_submit(driver, values):
    """Types `values` into the order form as a person would, then presses its button."""
    for name in ["user_id", "cart.id", "note"]:
        field = driver.find_element(By.NAME, name)
        field.clear()
        field.send_keys(values[name])
    Select(driver.find_element(By.NAME, "cart.items.0.sku")).select_by_value(values["sku"])
    qty = driver.find_element(By.NAME, "cart.items.0.qty")
    qty.clear()
    qty.send_keys(values["qty"])
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()


def form_values(driver):
    """What the form holds now (after going back, the browser may have restored it)."""
    return {name: driver.find_element(By.NAME, name).get_attribute("value")
            for name in ["user_id", "cart.id", "cart.items.0.sku", "cart.items.0.qty", "note"]}


def operation_page(driver):
    """(state, result) of the operation page the browser shows."""
    state = driver.find_element(By.ID, "state").get_attribute("data-state")
    result = json.loads(driver.find_element(By.ID, "result").text)
    return state, result


def scenario(driver, base, out):
    driver.get(f"{base}/")
    check(path_of(driver) == "/" and "place an order" in driver.title,
          f"the order form at {base}/ ({driver.title!r})")
    check(not driver.find_elements(By.TAG_NAME, "script"), "the form page has no script")
    check(orders(base) == [], "the ledger starts empty")

    fill_and_submit(driver, FIRST)
    wait_for_path(driver, OPERATION_PATH.match, "submitting the form")
    operation = driver.current_url
    check(OPERATION_PATH.match(path_of(driver)) is not None,
          f"the submission lands on the operation page {path_of(driver)}")
    state, result = operation_page(driver)
    check(state == "completed", f"the operation page shows completed (got {state})")
    check(result.get("order_id") == 1 and result.get("user_id") == 7
          and result.get("cart_id") == "cart-browser-1" and result.get("total_cents") == 2500,
          f"the operation page shows the order: {result}")
    check(not driver.find_elements(By.TAG_NAME, "script"), "the operation page has no script")
    check(len(orders(base)) == 1, "one order in the ledger after the submission")

    for i in range(1, 6):
        driver.refresh()
        wait_for_path(driver, OPERATION_PATH.match, f"reload {i}")
        check(driver.current_url == operation, f"reload {i} stays on the operation page")
        state, again = operation_page(driver)
        check(state == "completed" and again == result,
              f"reload {i} shows the same completed order")
        check(len(orders(base)) == 1, f"reload {i}: still one order in the ledger")

    driver.back()
    wait_for_path(driver, lambda p: p == "/", "going back to the form")
    check(path_of(driver) == "/", "back lands on the form")
    typed = {"user_id": FIRST["user_id"], "cart.id": FIRST["cart.id"],
             "cart.items.0.sku": FIRST["sku"], "cart.items.0.qty": FIRST["qty"],
             "note": FIRST["note"]}
    if form_values(driver) == typed:
        # What the 1990s user did: back, and press the button again on the restored form.
        print("   the browser restored the form as typed: pressing its button again", flush=True)
        driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    else:
        print(f"   the browser did not restore the form ({form_values(driver)}): typing the "
              "same values again", flush=True)
        fill_and_submit(driver, FIRST)
    wait_for_path(driver, OPERATION_PATH.match, "submitting the form again")
    ledger = orders(base)
    check(len(ledger) == 1,
          f"exactly one order in the ledger after five reloads and a resubmission ({len(ledger)})")
    check(driver.current_url == operation,
          "submitting the same form again lands on the same operation")
    state, again = operation_page(driver)
    check(state == "completed" and again == result,
          "the resubmission shows the same order, not a new one")

    screenshot = f"{out}/operation.png"
    check(driver.save_screenshot(screenshot), "screenshot of the result page saved")
    print(f"   screenshot: {screenshot}", flush=True)

    driver.get(f"{base}/")
    fill_and_submit(driver, SECOND)
    wait_for_path(driver, lambda p: OPERATION_PATH.match(p) and p != urlsplit(operation).path,
                  "submitting another cart")
    state, second = operation_page(driver)
    check(state == "completed" and second.get("order_id") == 2
          and second.get("cart_id") == "cart-browser-2",
          f"another cart is another operation and another order: {second}")
    driver.refresh()
    wait_for_path(driver, OPERATION_PATH.match, "reloading the second order")
    ledger = orders(base)
    check([o.get("cart_id") for o in ledger] == ["cart-browser-1", "cart-browser-2"],
          f"the ledger counts two orders, one per cart ({len(ledger)})")


def order_refunds(base):
    """The `order_refund` effects in the shop's ledger."""
    with DIRECT.open(f"{base}/ledger", timeout=10) as response:
        return [e for e in json.load(response) if e.get("effect") == "order_refund"]


def text_of(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def approval_scenario(driver, base, out):
    driver.get(f"{base}/refund")
    check("refund an order" in driver.title, f"the refund form at {base}/refund ({driver.title!r})")
    for name, value in [("order_id", "42"), ("amount_cents", "1999"),
                        ("reason", 'arrived <i>broken</i> & "late"')]:
        field = driver.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for_path(driver, OPERATION_PATH.match, "asking for the refund")
    operation = driver.current_url
    state = driver.find_element(By.ID, "state").get_attribute("data-state")
    check(state == "awaiting_approval", f"the refund lands on its operation page, awaiting approval ({state})")
    arguments = json.loads(text_of(driver, "arguments"))
    check(arguments == {"order_id": 42, "amount_cents": 1999, "reason": 'arrived <i>broken</i> & "late"'},
          f"the page shows the arguments as text: {arguments}")
    check(not driver.find_elements(By.TAG_NAME, "i"), "the reason's markup is not rendered")
    check(driver.find_elements(By.ID, "approve") and driver.find_elements(By.ID, "deny"),
          "the page has the Approve and Deny buttons")
    check(order_refunds(base) == [], "no refund before the approval")

    driver.find_element(By.ID, "approve-by").send_keys("Alice Example")
    driver.find_element(By.ID, "approve").click()
    wait_for_path(driver, lambda p: driver.current_url == operation
                  and driver.find_element(By.ID, "state").get_attribute("data-state") != "awaiting_approval",
                  "clicking Approve")
    state, result = operation_page(driver)
    check(state == "completed" and result.get("order_id") == 42 and result.get("amount_cents") == 1999,
          f"Approve lands on the operation page showing the refund: {state} {result}")
    decided = (text_of(driver, "decision"), text_of(driver, "decided-by"), text_of(driver, "decided-via"))
    check(decided == ("approved", "Alice Example", "http"),
          f"the page says who approved it and through which channel: {decided}")
    check(text_of(driver, "decided-at") != "", "the page says when")
    check(not driver.find_elements(By.TAG_NAME, "form"), "a decided refund has no forms")
    check(len(order_refunds(base)) == 1, "one refund after the approval")

    for i in range(1, 4):
        driver.refresh()
        wait_for_path(driver, OPERATION_PATH.match, f"reload {i} of the refund")
        state, again = operation_page(driver)
        check(driver.current_url == operation and state == "completed" and again == result,
              f"reload {i} shows the same refund")
    driver.get(f"{base}/refund")
    for name, value in [("order_id", "42"), ("amount_cents", "1999"),
                        ("reason", 'arrived <i>broken</i> & "late"')]:
        field = driver.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    driver.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    wait_for_path(driver, OPERATION_PATH.match, "sending the refund form again")
    state, again = operation_page(driver)
    check(driver.current_url == operation and state == "completed" and again == result,
          "sending the refund form again lands on the same, completed refund")
    refunds = order_refunds(base)
    check(len(refunds) == 1 and refunds[0].get("order_id") == 42,
          f"exactly one refund in the ledger after the approval, reloads and a resend ({len(refunds)})")
    screenshot = f"{out}/approval.png"
    check(driver.save_screenshot(screenshot), "screenshot of the approved refund saved")
    print(f"   screenshot: {screenshot}", flush=True)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: browser.py HTTP_SHOP_BINARY OUT_DIR")
    binary, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for stale in ["operation.png", "approval.png", "failure.png"]:
        if os.path.exists(f"{out}/{stale}"):
            os.remove(f"{out}/{stale}")
    work = tempfile.mkdtemp(prefix="run-", dir=out)
    server = driver = None
    log_path = None
    started = time.monotonic()
    try:
        server, base, log_path = start_server(binary, work)
        driver = start_browser(work)
        print(f"== {driver.capabilities.get('browserName')} "
              f"{driver.capabilities.get('browserVersion')} against {base}", flush=True)
        scenario(driver, base, out)
        approval_scenario(driver, base, out)
    except Exception as e:
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        if driver is not None:
            try:
                driver.save_screenshot(f"{out}/failure.png")
                print(f"--- the browser was on {driver.current_url}; screenshot {out}/failure.png",
                      file=sys.stderr)
            except Exception:
                pass
        if log_path:
            with open(log_path) as f:
                print(f"--- server log\n{f.read()}", file=sys.stderr)
        print(f"browser: {passed} passed, 1 failed")
        return 1
    finally:
        if driver is not None:
            driver.quit()
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"== {time.monotonic() - started:.1f} s")
    print(f"browser: {passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
