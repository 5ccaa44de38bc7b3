"""The v2 database's layout: the warehouse tables (with their lineage column) and the load log.

A v2 warehouse table holds the contract's columns of its table, then `batch_id`, the batch that
loaded the row (lineage, as a warehouse's load metadata column). `wh_load_log` holds one row per
batch loaded on an earlier night. Staging tables take their columns from each file's header.
"""
from __future__ import annotations

from .contract import COLUMNS_V2

WAREHOUSE_COLUMNS = {"customers": (*COLUMNS_V2["customers"], "batch_id"),
                     "orders": (*COLUMNS_V2["orders"], "batch_id")}
LOAD_LOG_COLUMNS = ("night", "batch_id", "table_name", "source", "rows", "amount_total", "amount_median")
WAREHOUSE_DDL = (
    "CREATE TABLE wh_customers (customer_id TEXT, email TEXT, country TEXT, signup_date TEXT, batch_id TEXT)",
    "CREATE TABLE wh_orders (order_id TEXT, customer_id TEXT, amount REAL, currency TEXT, status TEXT, "
    "order_date TEXT, note TEXT, batch_id TEXT)",
    "CREATE TABLE wh_load_log (night TEXT, batch_id TEXT, table_name TEXT, source TEXT, rows INTEGER, "
    "amount_total REAL, amount_median REAL)",
)
# the warehouse's keys and its one reference, indexed as a warehouse indexes them (the mart, the loader's
# orphan count and an agent's comparisons with the past look rows up by them)
INDEXES = ("CREATE INDEX wh_customers_customer_id ON wh_customers (customer_id)",
           "CREATE INDEX wh_orders_order_id ON wh_orders (order_id)",
           "CREATE INDEX wh_orders_customer_id_order_date ON wh_orders (customer_id, order_date)")
